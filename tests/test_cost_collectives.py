"""simulator.cost.collectives: alpha-beta ring collectives and the bus bandwidth of a placed group."""

from __future__ import annotations

import math

import pytest

from hwprofiles.load import load_cluster
from simulator.cost import collectives, layout
from simulator.cost.collectives import GroupLink

BW = 100e9  # bytes/s
NO_LATENCY = GroupLink(BW, 0.0)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 1024])
def test_ring_all_reduce_bandwidth_term(n):
    """Ring all-reduce moves 2(n-1)/n * S per rank."""
    S = 1e9
    assert collectives.all_reduce_time(S, n, NO_LATENCY) == pytest.approx(2 * (n - 1) / n * S / BW, rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 8, 1024])
def test_all_gather_and_reduce_scatter_are_half_an_all_reduce(n):
    S = 3e8
    ag = collectives.all_gather_time(S, n, NO_LATENCY)
    assert ag == pytest.approx((n - 1) / n * S / BW, rel=1e-12)
    assert collectives.reduce_scatter_time(S, n, NO_LATENCY) == ag
    assert collectives.all_reduce_time(S, n, NO_LATENCY) == pytest.approx(2 * ag)


def test_latency_steps():
    lat = 1e-5
    link = GroupLink(BW, lat)
    S = 1e6
    # n = 8: ring all-reduce has 2*7 = 14 steps, tree 2*ceil(log2 8) = 6: the smaller counts
    assert collectives.all_reduce_time(S, 8, link) == pytest.approx(2 * 7 / 8 * S / BW + 6 * lat)
    # n = 2: ring 2 steps, tree 2
    assert collectives.all_reduce_time(S, 2, link) == pytest.approx(S / BW + 2 * lat)
    # all-gather n = 2: ring 1 step < tree 2
    assert collectives.all_gather_time(S, 2, link) == pytest.approx(0.5 * S / BW + lat)
    # n = 1000: tree 2*10 = 20 steps
    assert collectives.all_reduce_time(S, 1000, link) == pytest.approx(2 * 999 / 1000 * S / BW + 20 * lat)
    # gloo runs rings only: n = 8 all-reduce 14 steps, all-gather 7
    rings = GroupLink(BW, lat, trees=False)
    assert collectives.all_reduce_time(S, 8, rings) == pytest.approx(2 * 7 / 8 * S / BW + 14 * lat)
    assert collectives.all_gather_time(S, 8, rings) == pytest.approx(7 / 8 * S / BW + 7 * lat)


def test_degenerate_collectives_are_free():
    link = GroupLink(BW, 1e-5)
    assert collectives.all_reduce_time(1e9, 1, link) == 0.0
    assert collectives.all_reduce_time(0.0, 8, link) == 0.0
    assert collectives.all_gather_time(1e9, 1, link) == 0.0
    assert collectives.p2p_time(0.0, BW, 1e-5) == 0.0


def test_p2p():
    assert collectives.p2p_time(1e9, BW, 2e-6) == pytest.approx(0.01 + 2e-6)


def test_all_reduce_time_grows_with_size_and_ranks():
    link = GroupLink(BW, 5e-6)
    sizes = [1e3, 1e6, 1e9]
    assert sorted(collectives.all_reduce_time(s, 8, link) for s in sizes) == [
        collectives.all_reduce_time(s, 8, link) for s in sizes
    ]
    times = [collectives.all_reduce_time(1e8, n, link) for n in (2, 4, 8, 16, 64)]
    assert times == sorted(times)


# ------------------------------------------------------------------------ group links


def test_group_link_inside_a_node_is_nvswitch():
    c = load_cluster("dgx-a100-80gb", 4)
    link = collectives.group_link(c, layout.tp_shape(8, 8))
    nv = c.node.intra_node
    assert link.bandwidth == pytest.approx(nv.bandwidth_GBps * 1e9 * nv.efficiency)
    assert link.latency == pytest.approx(nv.latency_us * 1e-6)


def test_group_link_across_nodes_shares_the_nics():
    """DP groups of a t=8 job: one member per node, 8 groups (one per tensor rank) leave each
    node at once and share its 8 NICs: one NIC each, at the bus bandwidth a 16-node ring reaches,
    (16 / 4) ** -0.094 = 0.878 of the few-node figure (NVIDIA/nccl#1229)."""
    c = load_cluster("dgx-a100-80gb", 16)
    nic = c.node.nic
    one_nic = nic.bandwidth_Gbps * 1e9 / 8 * nic.efficiency
    assert c.network.busbw_factor(16) == pytest.approx(4**-0.094) and c.network.busbw_factor(4) == 1.0
    shape = layout.dp_shape(8, 16, 8)
    assert (shape.per_node, shape.nodes, shape.concurrent) == (1, 16, 8)
    link = collectives.group_link(c, shape)
    assert link.bandwidth == pytest.approx(one_nic * 4**-0.094)
    assert link.latency >= nic.latency_us * 1e-6
    # t=2: 4 members per node, 2 groups share the node's 8 NICs -> 4 NICs' worth each
    shape = layout.dp_shape(2, 16, 8)
    assert (shape.per_node, shape.nodes, shape.concurrent) == (4, 4, 2)
    assert collectives.group_link(c, shape).bandwidth == pytest.approx(4 * one_nic)


def test_group_link_never_faster_than_the_intra_node_link():
    c = load_cluster("dgx-a100-80gb", 4)
    shape = layout.GroupShape(size=32, per_node=8, nodes=4, concurrent=1)  # 8 NICs = 184 GB/s
    nv = c.node.intra_node
    assert collectives.group_link(c, shape).bandwidth <= nv.bandwidth_GBps * 1e9 * nv.efficiency
    pcie = load_cluster("pcie-a100-80gb", 4)
    shape = layout.dp_shape(1, 32, 8)
    link = collectives.group_link(pcie, shape)
    assert link.bandwidth <= pcie.node.intra_node.bytes_per_s + 1e-6
    # and the inter-node hop of a 2-NIC server is much slower than a DGX's 8 NICs
    assert link.bandwidth < collectives.group_link(load_cluster("dgx-a100-80gb", 4), shape).bandwidth


def test_all_reduce_over_nics_reference_value():
    """1 GB gradient all-reduce over 16 nodes, one HDR NIC per rank (23 GB/s achieved):
    at 0.878 of that over 16 nodes (Network.busbw_factor): 2 * 15/16 * 1e9 / (23e9 * 0.878) =
    92.9 ms of bandwidth + 2*ceil(log2 16) = 8 latency steps."""
    c = load_cluster("dgx-a100-80gb", 16)
    link = collectives.group_link(c, layout.dp_shape(8, 16, 8))
    t = collectives.all_reduce_time(1e9, 16, link)
    assert t == pytest.approx(2 * 15 / 16 * 1e9 / (23e9 * 4**-0.094) + 8 * link.latency, rel=1e-9)
    assert 2 * math.ceil(math.log2(16)) == 8


def test_own_collective_fits_price_each_collective_inside_a_node():
    """A link with per-collective fits prices each collective at its own figures (hand values:
    4 ranks, 1 MB; all-reduce at 1 GB/s, 500 us: 2*3/4 * 1e6 / 1e9 + 6 * 500e-6 = 4.5 ms;
    reduce-scatter at 0.4 GB/s, 700 us: 3/4 * 1e6 / 0.4e9 + 3 * 700e-6 = 3.975 ms); a collective
    without a fit (all-gather here) keeps the link's 2 GB/s, 100 us: 0.375 ms + 0.3 ms."""
    link = GroupLink(
        2e9, 100e-6, trees=False, per_collective=(("all_reduce", 1e9, 500e-6), ("reduce_scatter", 0.4e9, 700e-6))
    )
    assert collectives.all_reduce_time(1e6, 4, link) == pytest.approx(4.5e-3, rel=1e-12)
    assert collectives.reduce_scatter_time(1e6, 4, link) == pytest.approx(3.975e-3, rel=1e-12)
    assert collectives.all_gather_time(1e6, 4, link) == pytest.approx(0.675e-3, rel=1e-12)


def test_node_fits_apply_inside_the_node_only():
    """group_link gives a one-node group the node's per-collective fits (localhost-cpu has them);
    a group that crosses nodes is priced by the NICs, where those fits were never measured."""
    c = load_cluster("localhost-cpu")
    link = collectives.group_link(c, layout.dp_shape(1, 4, 4))
    fit = c.node.collectives["reduce_scatter"]
    assert link.figures("reduce_scatter") == (fit.bytes_per_s, fit.latency_s)
    assert link.figures("all_reduce") == (
        c.node.collectives["all_reduce"].bytes_per_s,
        c.node.collectives["all_reduce"].latency_s,
    )
    dgx = load_cluster("dgx-a100-80gb", 4)
    across = collectives.group_link(dgx, layout.dp_shape(8, 4, 8))
    assert across.per_collective == () and across.figures("all_reduce") == (across.bandwidth, across.latency)


def test_the_losses_collectives_over_the_split_vocabulary():
    """1,000 tokens over t = 2 gloo ranks (rings; 1 GB/s, 0.1 ms a step): autoplan's program
    all-gathers 3 fp32 values per token from each rank, 24,000 bytes gathered: 12 us + 1 step;
    Megatron all-reduces 4,000 bytes three times: 3 (4 us + 2 steps); torchtitan's loss_parallel
    runs those three on each of 8 chunks of 500 bytes: 24 (0.5 us + 2 steps); DeepSpeed's AutoTP
    all-gathers the logits, 1,000 tokens of 100 bytes (50 bf16 logits) each: 100,000 bytes
    gathered, 50 us + 1 step; a whole-vocabulary loss runs none, and t = 1 none."""
    from simulator.cost.block_comm import loss_collectives_time

    link = GroupLink(1e9, 1e-4, trees=False)
    assert loss_collectives_time("split", 1000, 2, link) == pytest.approx(12e-6 + 1e-4)
    assert loss_collectives_time("fp32", 1000, 2, link) == pytest.approx(3 * (4e-6 + 2e-4))
    assert loss_collectives_time("chunked", 1000, 2, link) == pytest.approx(24 * (0.5e-6 + 2e-4))
    assert loss_collectives_time("gathered", 1000, 2, link, logit_bytes=100) == pytest.approx(50e-6 + 1e-4)
    assert loss_collectives_time("torch", 1000, 2, link) == 0.0
    assert loss_collectives_time("split", 1000, 1, link) == 0.0
