"""Ranks that share a CPU host slow each other only while they compute: a pipeline rank waiting
for its neighbour leaves its core to the others (simulator.cost.block_times.busy_ranks,
compute_slowdown; simulator.cost.schedules.compute_share)."""

from __future__ import annotations

import pytest

from hwprofiles.load import load_cluster
from simulator import simulate
from simulator.cost.block_times import block_times, busy_ranks, compute_slowdown
from simulator.cost.schedules import compute_share
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan

#: compute slots of the test node: 2 ranks at once 1.6 times one alone, 3 ranks 1.5, 4 ranks 1.8
SLOTS = {2: 1.6, 3: 1.5, 4: 1.8}


def cpu_cluster(ranks: int):
    cluster = load_cluster("localhost-cpu")
    node = cluster.node.model_copy(update={"gpus_per_node": ranks, "compute_slots": SLOTS})
    return cluster.model_copy(update={"node": node, "nodes": 1})


@pytest.mark.parametrize(
    ("schedule", "p", "v", "m", "share"),
    [
        ("1f1b", 4, 1, 4, 4 / 7),  # m / (m + p - 1)
        ("gpipe", 2, 1, 2, 2 / 3),
        ("interleaved", 4, 2, 4, 8 / 11),  # v m / (v m + p - 1)
        ("1f1b", 1, 1, 1, 1.0),  # no pipeline
        ("zbh1", 4, 1, 4, 1.0),  # the weight passes fill the bubble
        ("zbv", 4, 2, 8, 1.0),
    ],
)
def test_compute_share_is_one_less_the_bubble(schedule, p, v, m, share):
    assert compute_share(schedule, p, v, m) == pytest.approx(share)


def test_slowdown_of_the_ranks_that_compute_at_once():
    cluster = cpu_cluster(4)
    assert compute_slowdown(cluster) == pytest.approx(4 / 1.8)  # all 4 ranks
    assert compute_slowdown(cluster, 2.5) == pytest.approx(2.5 / 1.55)  # slots halfway between 1.6 and 1.5
    assert compute_slowdown(cluster, 1.5) == pytest.approx(1.5 / 1.3)  # one rank alone has 1 slot
    assert compute_slowdown(cluster, 1.0) == 1.0
    # p = 4, m = 4, 1F1B: 4 ranks compute 4/7 of the step, 16/7 of them at once
    plan = Plan(p=4)
    assert busy_ranks(cluster, plan, 4) == pytest.approx(16 / 7)
    gpu = load_cluster("dgx-a100-80gb", 1)
    assert busy_ranks(gpu, Plan(p=4, d=2), 4) is None  # each GPU rank has its own device


def test_a_cpu_pipeline_computes_at_the_slowdown_of_its_busy_ranks():
    """A CPU rank both issues and runs its ops: its layer times scale with the slowdown alone, so
    the times at 16/7 busy ranks are those of all 4 times (16/7 / slots(16/7)) / (4 / 1.8)."""
    model, cluster = load_model("tiny"), cpu_cluster(4)
    busy = 16 / 7
    slots = 1.6 + (busy - 2) * (1.5 - 1.6)
    alone, shared = (block_times(model, cluster, 1, False, 2, busy=b).layer.forward for b in (None, busy))
    assert shared / alone == pytest.approx((busy / slots) / (4 / 1.8))
    job = Job(model, cluster, Plan(p=4, mb=2), 8)  # m = 4: the analytic and the DES price the same passes
    assert simulate(job, "des").step_time == pytest.approx(simulate(job, "analytic").step_time, rel=0.02)


def test_data_parallel_collectives_wait_for_a_core_like_the_tensor_parallel_ones():
    """On the 4-rank CPU node every step of a data-parallel or shard group's collective pays the busy-core wait
    (localhost-cpu's busy_latency_us at 4 ranks), as a tensor-parallel all-reduce does;
    on a GPU node nothing changes."""
    from simulator.cost import collectives, layout
    from simulator.cost.zero3 import shard_links

    cpu = load_cluster("localhost-cpu")  # 4 ranks
    wait = cpu.node.busy_latency_us[4] * 1e-6
    bare = collectives.group_link(cpu, layout.dp_shape(1, 4, 4))
    assert shard_links(cpu, Plan(d=4, zero=3), "native").shard.latency == pytest.approx(bare.latency + wait)
    assert collectives.dp_link(cpu, 1, 4).latency == pytest.approx(bare.latency + wait)  # DDP's buckets
    gpu = load_cluster("dgx-a100-80gb", 1)
    assert shard_links(gpu, Plan(d=8, zero=3), "native").shard == collectives.group_link(gpu, layout.dp_shape(1, 8, 8))
    assert collectives.dp_link(gpu, 1, 8) == collectives.group_link(gpu, layout.dp_shape(1, 8, 8))
