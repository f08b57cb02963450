"""Messages sent inside a pass on a node whose CPU ranks outnumber the cores wait for a core
(NodeProfile.busy_latency_us): the schema's lookup, the tensor-parallel link, the pipeline
send in the analytic estimate and the DES, and calibrate's measurement with 3 ranks."""

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
from simulator.des import simulate_des
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan


def _cpu_cluster(wait_us: float | None):
    """The committed localhost-cpu cluster with ``busy_latency_us: {4: wait_us}`` (None: absent)
    and no sync wait (tests/test_sync_wait.py), so that only the busy-core wait differs."""
    return localhost_cpu(busy_latency_us=None if wait_us is None else {4: wait_us}, sync_wait_us=None)


def test_lookup_takes_the_largest_measured_count_up_to_the_ranks():
    node = node_from_mapping(dict(NODE_MAPPING, busy_latency_us={4: 500.0, 8: 900.0}), "n.yaml")
    assert node.busy_latency_s(2) == 0.0  # fewer ranks than measured: cores to spare
    assert node.busy_latency_s(4) == pytest.approx(500e-6)
    assert node.busy_latency_s(6) == pytest.approx(500e-6)
    assert node.busy_latency_s(16) == pytest.approx(900e-6)
    assert node_from_mapping(NODE_MAPPING, "n.yaml").busy_latency_s(8) == 0.0
    with pytest.raises(Exception, match="busy_latency_us"):
        node_from_mapping(dict(NODE_MAPPING, busy_latency_us={4: -1.0}), "n.yaml")


def test_tensor_parallel_all_reduce_pays_the_wait_every_step():
    """t=2 on gloo: a 2-rank ring all-reduce of the activations (mb*s*h*4 bytes) takes
    2(n-1)/n * S / B + 2(n-1) * (a + wait); with a 500 us wait that is 2 * 500 us more."""
    model = load_model("tiny")
    plain, busy = _cpu_cluster(None), _cpu_cluster(500.0)
    S = 1 * model.seq_length * model.hidden_size * 4
    bw, lat = plain.node.intra_figures("all_reduce")
    assert block_times(model, plain, 2, False, 1).tp_all_reduce == pytest.approx(S / bw + 2 * lat, rel=1e-9)
    assert block_times(model, busy, 2, False, 1).tp_all_reduce == pytest.approx(S / bw + 2 * (lat + 500e-6), rel=1e-9)
    # step-end collectives, when no rank computes, do not wait
    link = collectives.group_link(busy, layout.dp_shape(1, 4, 4))
    assert link.figures("all_reduce") == (bw, lat)


def test_pipeline_send_inside_a_node_pays_the_wait_in_both_simulators():
    """p=2 on gloo: a send of mb*s*h*4 bytes is S / B_sr + a_sr + wait; the DES charges it too
    (its pipeline timeline differs from the closed form by ~0.02% here)."""
    model = load_model("tiny")
    plain, busy = _cpu_cluster(None), _cpu_cluster(500.0)
    S = 1 * model.seq_length * model.hidden_size * 4
    bw, lat = plain.node.intra_figures("send_recv")
    plan = Plan(t=1, p=2, d=2)
    assert p2p_exposed(Job.make(model, plain, plan, 8)) == pytest.approx(S / bw + lat, rel=1e-9)
    job = Job.make(model, busy, plan, 8)
    assert p2p_exposed(job) == pytest.approx(S / bw + lat + 500e-6, rel=1e-9)
    assert simulate_des(job).step_time == pytest.approx(estimate(job).step_time, rel=1e-3)
    without = Job.make(model, plain, plan, 8)
    assert estimate(job).step_time > estimate(without).step_time
    assert simulate_des(job).step_time > simulate_des(without).step_time


def test_gpu_nodes_have_no_wait():
    c = load_cluster("dgx-a100-80gb")
    assert collectives.in_pass_wait(c) == 0.0
    shape = layout.tp_shape(8, 8)
    assert collectives.in_pass_link(c, shape) == collectives.group_link(c, shape)


def _wait_worker(rank: int, world: int, port: int, out) -> None:
    import torch.distributed as dist

    from hwprofiles.calibrate.wait import busy_wait_s

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        got = busy_wait_s(rank, world, rounds=1)
        if rank == 0:
            out.put(got)
    finally:
        dist.destroy_process_group()


def test_calibrate_measures_the_wait_with_three_ranks():
    """Rank 0 reports a latency (a finite, non-negative median; how large depends on the host's
    load, so no upper bound is asserted here); with 2 ranks nothing is measured."""
    import torch.multiprocessing as mp

    from hwprofiles.calibrate.wait import busy_wait_s

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_wait_worker, args=(3, free_port(), out), nprocs=3, join=True, start_method="spawn")
    got = out.get(timeout=10)
    assert got is not None and math.isfinite(got) and got >= 0.0
    assert busy_wait_s(0, 2) is None
