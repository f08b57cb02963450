"""Per-step costs outside the pipeline: the calibrated eager optimizer and the two scalar
all-reduces (gradient norm, loss), against hand-derived numbers; the DES charges the same."""

from __future__ import annotations

import pytest

from hwprofiles import load_cluster
from simulator.analytic import estimate
from simulator.cost.step import optimizer_time, step_sync_time
from simulator.des import simulate_des
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan


def cpu_cluster(gpus_per_node: int | None = None, **eager_update):
    """The committed localhost-cpu node (``gpus_per_node`` of its ranks) with the given eager
    optimizer figures."""
    c = load_cluster("localhost-cpu", None, gpus_per_node)
    eager = c.gpu.eager.model_copy(update=eager_update)
    gpu = c.gpu.model_copy(update={"eager": eager})
    return c.model_copy(update={"node": c.node.model_copy(update={"gpu": gpu})})


def test_calibrated_optimizer_is_tensors_plus_parameters_on_a_cpu_rank():
    c = cpu_cluster(optimizer_tensor_us=50.0, optimizer_param_ns=4.0)
    job = Job.make(load_model("tiny"), c, Plan(t=1, p=1, d=4), 4)
    # 52 tensors * 50 us + 1e6 params * 4 ns = 2.6 ms + 4 ms, one rank alone: no slowdown
    one = cpu_cluster(1, optimizer_tensor_us=50.0, optimizer_param_ns=4.0)
    assert optimizer_time(Job.make(load_model("tiny"), one, Plan(t=1, p=1, d=1), 1), 1e6, 52) == pytest.approx(6.6e-3)
    # four ranks on the node's slots: the same times the slowdown 4 / slots(4)
    slowdown = 4 / c.node.slots_for(4)
    assert optimizer_time(job, 1e6, 52) == pytest.approx(6.6e-3 * max(1.0, slowdown))


def test_calibrated_optimizer_on_a_gpu_overlaps_host_and_kernels():
    c = load_cluster("dgx-a100-80gb", 1)
    eager = {
        "layer_forward_us": 1,
        "layer_backward_us": 1,
        "embedding_forward_us": 1,
        "embedding_backward_us": 1,
        "head_forward_us": 1,
        "head_backward_us": 1,
        "optimizer_tensor_us": 20.0,
        "optimizer_param_ns": 0.05,
    }
    # speed_spread 0: the rule alone, without the slowest-of-8-GPUs factor (simulator.cost.variability)
    gpu = c.gpu.model_validate({**c.gpu.model_dump(), "eager": eager, "speed_spread": 0.0})
    c = c.model_copy(update={"node": c.node.model_copy(update={"gpu": gpu})})
    job = Job.make(load_model("tiny"), c, Plan(t=4, p=1, d=2), 2)
    # max(100 tensors * 20 us, 1e8 params * 0.05 ns) = max(2 ms, 5 ms)
    assert optimizer_time(job, 1e8, 100) == pytest.approx(5e-3)
    assert optimizer_time(job, 1e6, 100) == pytest.approx(2e-3)


def test_step_syncs_on_gloo_are_ring_latency_bound():
    c = load_cluster("localhost-cpu")
    bw, lat = c.node.intra_figures("all_reduce")  # the node's own all-reduce fit
    job = Job.make(load_model("tiny"), c, Plan(t=1, p=1, d=4), 8)
    # gloo rings, 4 ranks: 6 steps each; norm 8 B and loss 4 B over the same 4 ranks; each
    # issued after computing pays the ranks' sync wait once
    wait = c.node.sync_wait_s(4)
    assert wait > 0
    norm = 6 * lat + 2 * 3 / 4 * 8 / bw + wait
    loss = 6 * lat + 2 * 3 / 4 * 4 / bw + wait
    assert step_sync_time(job) == pytest.approx(norm + loss)
    # no data parallelism: only the norm, over t*p = 4 ranks
    assert step_sync_time(Job.make(load_model("tiny"), c, Plan(t=2, p=2, d=1), 8)) == pytest.approx(norm)
    # one rank: nothing to reduce
    one = load_cluster("localhost-cpu", None, 1)
    assert step_sync_time(Job.make(load_model("tiny"), one, Plan(t=1, p=1, d=1), 8)) == 0.0


def test_step_syncs_on_nccl_use_trees():
    c = load_cluster("dgx-a100-80gb", 1)
    lat, bw = c.node.intra_node.latency_s, c.node.intra_node.bytes_per_s
    job = Job.make(load_model("tiny"), c, Plan(t=1, p=1, d=8), 8)
    # 8 ranks: tree 2*ceil(log2 8) = 6 steps instead of the ring's 14
    expected = 6 * lat + 2 * 7 / 8 * 8 / bw + 6 * lat + 2 * 7 / 8 * 4 / bw
    assert step_sync_time(job) == pytest.approx(expected)


def test_des_charges_the_step_syncs_like_the_analytic():
    c = load_cluster("localhost-cpu")
    job = Job.make(load_model("tiny"), c, Plan(t=1, p=1, d=4), 8)
    a, d = estimate(job), simulate_des(job)
    assert d.time_breakdown["dp_comm"] == pytest.approx(a.time_breakdown["dp_comm"], rel=1e-6)
    assert d.step_time == pytest.approx(a.step_time, rel=1e-6)
    assert d.time_breakdown["dp_comm"] >= step_sync_time(job)
