"""Every blocking collective or message that CPU ranks issue between computations pays the
ranks' sync wait once (NodeProfile.sync_wait_us) and the bus wait on each bus byte
(NodeProfile.sync_bus_us_per_MB): the schema's lookup, the links, the step's scalar all-reduces,
the pipeline send in the analytic estimate and the DES, and calibrate's measurement with 2 ranks."""

from __future__ import annotations

import math
import os

import pytest
from conftest import NODE_MAPPING, free_port, localhost_cpu

from hwprofiles import load_cluster
from hwprofiles.load import node_from_mapping
from simulator.analytic import estimate
from simulator.analytic.pipeline import p2p_exposed
from simulator.cost import collectives, layout
from simulator.cost.block_times import block_times
from simulator.cost.step import GRAD_NORM_BYTES, LOSS_BYTES, step_sync_time
from simulator.des import simulate_des
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan

WAIT_US = 300.0
BUS_US_PER_MB = 800.0  # 0.8 ns per bus byte


def _cpu_cluster(wait_us: float | None, ranks: int = 2, bus_us_per_MB: float | None = None):
    """The committed localhost-cpu cluster with ``ranks`` ranks, ``sync_wait_us: {2: wait_us}``
    and ``sync_bus_us_per_MB: {2: bus_us_per_MB}`` (None: absent) and no busy-core latency, so
    that only the sync waits differ."""
    return localhost_cpu(
        ranks,
        busy_latency_us=None,
        sync_wait_us=None if wait_us is None else {2: wait_us},
        sync_bus_us_per_MB=None if bus_us_per_MB is None else {2: bus_us_per_MB},
    )


def test_lookup_takes_the_largest_measured_count_up_to_the_ranks():
    node = node_from_mapping(dict(NODE_MAPPING, sync_wait_us={2: 300.0, 8: 900.0}), "n.yaml")
    assert node.sync_wait_s(1) == 0.0  # one rank waits for nobody
    assert node.sync_wait_s(2) == pytest.approx(300e-6)
    assert node.sync_wait_s(4) == pytest.approx(300e-6)
    assert node.sync_wait_s(8) == pytest.approx(900e-6)
    assert node_from_mapping(NODE_MAPPING, "n.yaml").sync_wait_s(8) == 0.0
    with pytest.raises(Exception, match="sync_wait_us"):
        node_from_mapping(dict(NODE_MAPPING, sync_wait_us={2: -1.0}), "n.yaml")


def test_bus_wait_lookup_is_per_byte():
    node = node_from_mapping(dict(NODE_MAPPING, sync_bus_us_per_MB={2: 800.0}), "n.yaml")
    assert node.sync_bus_s_per_byte(1) == 0.0
    assert node.sync_bus_s_per_byte(4) == pytest.approx(0.8e-9)  # 800 us per 1e6 bytes
    assert node_from_mapping(NODE_MAPPING, "n.yaml").sync_bus_s_per_byte(4) == 0.0
    with pytest.raises(Exception, match="sync_bus_us_per_MB"):
        node_from_mapping(dict(NODE_MAPPING, sync_bus_us_per_MB={2: -1.0}), "n.yaml")


def test_all_reduce_after_compute_moves_each_bus_byte_slower():
    """t=2 on gloo with a bus wait w: 2(n-1)/n * S * (1/B + w) + 2(n-1) * a + W, for n = 2
    S/B + S w + 2a + W; the bus wait alone adds S w."""
    model = load_model("tiny")
    S = 1 * model.seq_length * model.hidden_size * 4
    bw, lat = _cpu_cluster(None).node.intra_figures("all_reduce")
    got = block_times(model, _cpu_cluster(WAIT_US, bus_us_per_MB=BUS_US_PER_MB), 2, False, 1).tp_all_reduce
    assert got == pytest.approx(S / bw + S * 0.8e-9 + 2 * lat + WAIT_US * 1e-6, rel=1e-9)
    only_bus = block_times(model, _cpu_cluster(None, bus_us_per_MB=BUS_US_PER_MB), 2, False, 1).tp_all_reduce
    assert only_bus == pytest.approx(S / bw + S * 0.8e-9 + 2 * lat, rel=1e-9)


def test_pipeline_send_and_zero3_pay_the_bus_wait_in_both_simulators():
    """p=2: the send of S bytes grows by S w; d=2 ZeRO-3: every gather and reduce-scatter by its
    bus bytes times w, in the closed form and the DES alike (their step times agree as without)."""
    model = load_model("tiny")
    S = 1 * model.seq_length * model.hidden_size * 4
    plain, bused = _cpu_cluster(None), _cpu_cluster(None, bus_us_per_MB=BUS_US_PER_MB)
    send = Job.make(model, bused, Plan(t=1, p=2, d=1), 8)
    assert p2p_exposed(send) - p2p_exposed(Job.make(model, plain, Plan(t=1, p=2, d=1), 8)) == pytest.approx(
        S * 0.8e-9, rel=1e-6
    )
    for plan in (Plan(t=1, p=2, d=1), Plan(t=1, p=1, d=2, zero=3)):
        slow, fast = (Job.make(model, c, plan, 8) for c in (bused, plain))
        assert estimate(slow).step_time > estimate(fast).step_time
        assert simulate_des(slow).step_time > simulate_des(fast).step_time
    gap = [estimate(Job.make(model, c, Plan(t=1, p=1, d=2, zero=3), 8)).step_time for c in (bused, plain)]
    des = [simulate_des(Job.make(model, c, Plan(t=1, p=1, d=2, zero=3), 8)).step_time for c in (bused, plain)]
    assert des[0] - des[1] == pytest.approx(gap[0] - gap[1], rel=0.15)  # the DES overlaps some of it


def test_tensor_parallel_all_reduce_pays_the_wait_once_per_call():
    """t=2 on gloo: a 2-rank ring all-reduce of the activations (mb*s*h*4 bytes) takes
    2(n-1)/n * S / B + 2(n-1) * a + W, the wait once however many steps the ring has."""
    model = load_model("tiny")
    plain, synced = _cpu_cluster(None), _cpu_cluster(WAIT_US)
    S = 1 * model.seq_length * model.hidden_size * 4
    bw, lat = plain.node.intra_figures("all_reduce")
    assert block_times(model, plain, 2, False, 1).tp_all_reduce == pytest.approx(S / bw + 2 * lat, rel=1e-9)
    got = block_times(model, synced, 2, False, 1).tp_all_reduce
    assert got == pytest.approx(S / bw + 2 * lat + WAIT_US * 1e-6, rel=1e-9)


def test_step_scalar_all_reduces_each_pay_the_wait():
    """d=2: the gradient norm's and the loss's all-reduces (8 and 4 bytes over 2 ranks), each
    S/B + 2a + W."""
    model = load_model("tiny")
    synced = _cpu_cluster(WAIT_US)
    bw, lat = synced.node.intra_figures("all_reduce")
    want = sum(b / bw + 2 * lat + WAIT_US * 1e-6 for b in (GRAD_NORM_BYTES, LOSS_BYTES))
    assert step_sync_time(Job.make(model, synced, Plan(t=1, p=1, d=2), 8)) == pytest.approx(want, rel=1e-9)


def test_pipeline_send_pays_the_wait_in_both_simulators():
    """p=2 on gloo: a send of mb*s*h*4 bytes is S / B_sr + a_sr + W; the DES charges it too."""
    model = load_model("tiny")
    plain, synced = _cpu_cluster(None), _cpu_cluster(WAIT_US)
    S = 1 * model.seq_length * model.hidden_size * 4
    bw, lat = plain.node.intra_figures("send_recv")
    plan = Plan(t=1, p=2, d=1)
    assert p2p_exposed(Job.make(model, plain, plan, 8)) == pytest.approx(S / bw + lat, rel=1e-9)
    job = Job.make(model, synced, plan, 8)
    assert p2p_exposed(job) == pytest.approx(S / bw + lat + WAIT_US * 1e-6, rel=1e-9)
    assert simulate_des(job).step_time == pytest.approx(estimate(job).step_time, rel=1e-3)
    without = Job.make(model, plain, plan, 8)
    assert estimate(job).step_time > estimate(without).step_time
    assert simulate_des(job).step_time > simulate_des(without).step_time


def test_zero3_step_pays_the_wait_at_every_collective():
    """d=2, ZeRO-3 (FSDP2) on gloo, mb=1 of B=8: m = 4 microbatches, each gathering its 5 units
    (4 layers and the root) before the forward and again before the backward and
    reduce-scattering them: 15 collectives, 60 per step, plus the 2 scalar all-reduces, so the
    closed form grows by 62 W. The DES grows too (it lets a prefetched gather's latency overlap
    compute, so by less)."""
    model = load_model("tiny")
    plan = Plan(t=1, p=1, d=2, zero=3)
    plain, synced = (Job.make(model, _cpu_cluster(w), plan, 8) for w in (None, WAIT_US))
    grow = estimate(synced).step_time - estimate(plain).step_time
    assert grow == pytest.approx(62 * WAIT_US * 1e-6, rel=1e-6)
    assert simulate_des(synced).step_time - simulate_des(plain).step_time > 10 * WAIT_US * 1e-6


def test_gpu_nodes_and_one_rank_have_no_wait():
    c = load_cluster("dgx-a100-80gb")
    assert collectives.sync_wait(c) == 0.0
    shape = layout.tp_shape(8, 8)
    assert collectives.sync_link(c, shape) == collectives.group_link(c, shape)
    assert collectives.sync_wait(_cpu_cluster(WAIT_US, ranks=1)) == 0.0


def _sync_worker(rank: int, world: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    from hwprofiles.calibrate.wait import sync_wait_s

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        got = sync_wait_s(rank, world, rounds=1, calls=5)
        if rank == 0:
            out.put(got)
    finally:
        dist.destroy_process_group()


def test_calibrate_measures_the_wait_with_two_ranks():
    """Rank 0 reports a wait for 2 busy ranks where the host has 2 cores (finite, >= 0; how
    large depends on the host, so no upper bound is asserted), none where it has one."""
    import torch.multiprocessing as mp

    from hwprofiles.calibrate.host import cpu_cores

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_sync_worker, args=(2, free_port(), out), nprocs=2, join=True, start_method="spawn")
    waits, per_byte = out.get(timeout=10)
    if cpu_cores() < 2:
        assert waits == {} and per_byte == {}
    else:
        assert set(waits) == set(per_byte) == {2}
        assert math.isfinite(waits[2]) and waits[2] >= 0.0 and math.isfinite(per_byte[2]) and per_byte[2] >= 0.0
