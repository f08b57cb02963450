"""Issue 19's cost rules, each against a number derived by hand: contention, flash attention,
ZeRO-3 per unit, ring latency, bus bandwidth at scale."""

from __future__ import annotations

import pytest

from hwprofiles.algorithms import Collective, latency_split, latency_steps
from hwprofiles.load import load_cluster
from simulator.analytic import estimate
from simulator.cost import attention, collectives, layout, memory, ops, zero3
from simulator.cost.overlap import overlap_cost, overlapped
from simulator.cost.stage import StageCost
from simulator.des import flows
from simulator.des.topology import Topology
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan
from simulator.runtime_spec import DEEPSPEED_ZERO3, OVERLAPPED


def test_overlap_costs_sigma_of_the_overlapped_time():
    # 10 s of compute beside 4 s of traffic at sigma 0.3: 10 + 0.3 * 4 = 11.2 s
    assert overlapped(10.0, 4.0, 0.3) == pytest.approx(11.2)
    assert overlap_cost(10.0, 4.0, 0.3) == pytest.approx(1.2)
    # traffic longer than the compute: the traffic bounds the span (max(10 + 3, 14) = 14)
    assert overlapped(10.0, 14.0, 0.3) == pytest.approx(14.0)
    assert overlapped(10.0, 0.0, 0.3) == 10.0 and overlapped(10.0, 4.0, 0.0) == 10.0  # sigma 0: free overlap


def test_flash_attention_op_and_memory():
    m = load_model("llama2-7b")  # s = 4096, a = 32, head_dim 128, MHA
    b, t, e = 2, 2, 2
    (op,) = attention.attention_ops(m, b, m.num_attention_heads // t, e)
    # causal: half of 4*b*s^2*h/t = 2 * 2 * 16 * 4096^2 * 128
    assert op.kind == "attention" and op.flops == pytest.approx(2 * 2 * 16 * 4096**2 * 128)
    (bwd,) = ops.backward_ops(op)
    assert bwd.flops == pytest.approx(2.5 * op.flops)  # FlashAttention-2: the backward recomputes the scores
    # it keeps the fp32 log-sum-exp per query row: 4 * a * s * b / t bytes, no s x s scores
    assert memory.attention_core_bytes(m, b, t, e) == pytest.approx(4 * 32 * 4096 * 2 / 2)
    mat = m.model_copy(update={"attention": "materialized"})
    assert memory.attention_core_bytes(mat, b, t, e) == pytest.approx((2 * e + 1) * 32 * 4096**2 * 2 / 2)
    assert [o.name for o in attention.attention_ops(mat, b, 16, e)] == ["scores", "softmax", "attn_dropout", "attn_v"]


def test_attention_efficiency_curve():
    gpu = load_cluster("dgx-h100").gpu
    assert gpu.attention is not None
    a = gpu.attention
    # eff(s) = top * s / (s + half_seq): at s = half_seq, half the top efficiency
    assert a.efficiency(a.half_seq, backward=False) == pytest.approx(a.forward_efficiency / 2)
    assert a.efficiency(a.half_seq, backward=True) == pytest.approx(a.backward_efficiency / 2)


def test_all_gather_and_reduce_scatter_latency_is_a_ring():
    assert latency_steps(1536, Collective.ALL_GATHER) == 1535  # not 2*ceil(log2 1536) = 22
    assert latency_steps(1536, Collective.REDUCE_SCATTER) == 1535
    assert latency_steps(1536, Collective.ALL_REDUCE) == 22  # NCCL's tree all-reduce
    assert latency_steps(1536, Collective.ALL_REDUCE, trees=False) == 2 * 1535


def test_a_ring_across_nodes_pays_nccls_split_of_its_steps():
    # NCCL 2.9.9 tuning.cc: (nsteps - nInterSteps) * intraLat + nInterSteps * interLat, nInterSteps = N - 1
    assert latency_split(1536, 192, Collective.ALL_GATHER, True, 3e-6, 5e-6) == (1344, 191)
    assert latency_split(1536, 192, Collective.ALL_REDUCE, False, 3e-6, 5e-6) == (2688, 382)
    # the tree's 22 steps, the top 2 * ceil(log2 192) = 16 across nodes, cost less than the ring's
    assert latency_split(1536, 192, Collective.ALL_REDUCE, True, 3e-6, 5e-6) == (6, 16)
    assert latency_split(8, 1, Collective.ALL_GATHER, True, 3e-6, 5e-6) == (7, 0)
    assert latency_split(2, 2, Collective.SEND_RECV, True, 3e-6, 5e-6) == (0, 1)
    # 1536 A100s on 192 DGX nodes: 1344 NVSwitch steps at 3 us and 191 NIC steps at 5 + 3 * 0.13 us
    c = load_cluster("dgx-a100-80gb", nodes=192)
    link = collectives.group_link(c, layout.dp_shape(1, 1536, 8))
    assert link.latency_seconds(Collective.ALL_GATHER, 1536) == pytest.approx(1344 * 3e-6 + 191 * 5.39e-6)


def test_the_des_pays_the_same_steps_inside_and_across_nodes():
    c = load_cluster("dgx-a100-80gb", nodes=4)
    topo = Topology(c)
    phases = flows.collective_phases(topo, Collective.ALL_GATHER, list(range(32)), 1.0)
    # the inter-node rings take the 3 steps across nodes, the rings inside the nodes the other 28
    assert [ph.steps for ph in phases] == [3, 28]
    # an all-reduce runs as trees, 2 * ceil(log2 32) = 10 steps, the top 2 * ceil(log2 4) = 4 across nodes
    reduce = flows.collective_phases(topo, Collective.ALL_REDUCE, list(range(32)), 1.0)
    assert [ph.steps for ph in reduce] == [3, 4, 3]


def test_bus_bandwidth_falls_with_the_nodes_a_ring_spans():
    net = load_cluster("dgx-h100", nodes=128).network
    # NVIDIA/nccl#1229: 360 GB/s at 4 nodes, 260 at 128
    assert 360 * net.busbw_factor(128) == pytest.approx(260, rel=0.01)
    assert net.busbw_factor(2) == 1.0


def _stage(params: float, layers: int, forward: float, backward: float, full: int = 0) -> StageCost:
    return StageCost(
        layers=layers, full_layers=full, selective_layers=0, params=params, first=False, last=False,
        forward=forward, backward=backward,
    )  # fmt: skip


def test_zero3_pass_per_unit_by_hand():
    c = load_cluster("dgx-a100-80gb", nodes=4)
    link = collectives.group_link(c, layout.dp_shape(1, 32, 8))
    stage = _stage(params=8e9, layers=8, forward=1.0, backward=2.0, full=8)
    links = zero3.ShardLinks(link, 32, None, 1, "native")
    z = zero3.zero3_pass(stage, links, 2, 16e9, OVERLAPPED, c.gpu)  # 8e9 parameters gathered at 2 bytes
    # 8 units of 1e9 parameters: each a ring all-gather of 2 GB and an fp32 reduce-scatter of 4 GB
    assert z.units == 8
    assert z.gather == pytest.approx(8 * collectives.all_gather_time(2e9, 32, link))
    assert z.scatter == pytest.approx(8 * collectives.reduce_scatter_time(4e9, 32, link))
    # FSDP2 copies the gathered 16 GB out: read + write 32 GB of HBM per pass
    assert z.copy_out == pytest.approx(32e9 / (c.gpu.memory_bandwidth_GBps * 1e9 * c.gpu.memory_efficiency))
    assert z.regather == 0.0
    g, r, sigma = z.gather / 8, z.scatter / 8, c.gpu.comm_overlap_slowdown
    fwd = g + overlap_cost(1.0, z.gather - g, sigma) + z.copy_out
    bwd = g + r + overlap_cost(2.0, z.gather + z.scatter - g - r, sigma) + z.copy_out
    assert z.exposed(1.0, 2.0, sigma) == pytest.approx(fwd + bwd)
    # DeepSpeed gathers module by module, 4 per layer (32 all-gathers of 0.5 GB: the same bytes and 24
    # more rings' latency, each 28 steps inside the 4 nodes at NVSwitch's 3 us and 3 across at the NIC's
    # 5 us plus 3 switches' 0.13 us), gathers every fully recomputed layer once more, reduces in bf16
    # and copies nothing out
    ds = zero3.zero3_pass(stage, links, 2, 16e9, DEEPSPEED_ZERO3, c.gpu)
    assert ds.gather == pytest.approx(32 * collectives.all_gather_time(0.5e9, 32, link))
    assert ds.gather - z.gather == pytest.approx(24 * (28 * 3e-6 + 3 * 5.39e-6))
    assert ds.regather == pytest.approx(ds.gather) and ds.copy_out == 0.0
    assert ds.scatter == pytest.approx(8 * collectives.reduce_scatter_time(2e9, 32, link))


def test_deepspeed_gathers_module_by_module():
    """FSDP gathers a layer in one collective; DeepSpeed stage 3 each of its four Linear modules: a
    stage of 12 layers holding the embedding makes 13 gathers per pass under FSDP, 12 * 4 + 1 = 49
    under DeepSpeed; numbers or arrays alike."""
    import numpy as np

    assert zero3.gather_collectives(12, True, False, OVERLAPPED) == 13
    assert zero3.gather_collectives(12, True, False, DEEPSPEED_ZERO3) == 49
    got = zero3.gather_collectives(
        np.array([12, 0]), np.array([False, False]), np.array([True, False]), DEEPSPEED_ZERO3
    )
    assert got.tolist() == [49, 1]


def test_main_job_zero3_plan_pays_for_its_traffic():
    """The audit's plan (t=4, d=256, ZeRO-3 at 175B): its NICs carry ~11 s of traffic per step;
    the prediction may no longer hide it for free under 16 s of compute."""
    c = load_cluster("dgx-a100-80gb", nodes=128)
    plan = Plan(t=4, p=1, d=256, mb=3, zero=3, ckpt="selective", sp=1)
    r = estimate(Job.make(load_model("gpt3-175b"), c, plan, 1536))
    # before issue 19 it was charged 0.000 s (fidelity audit); now at least a tenth of the step
    assert r.time_breakdown["dp_comm"] > 0.1 * r.step_time
