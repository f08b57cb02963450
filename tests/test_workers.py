"""The search's worker processes run with the cyclic garbage collector off (autoplan.workers.Pool):
what they run must make no reference cycles, or their memory would grow with every task."""

from __future__ import annotations

import gc

import pytest

from autoplan import space
from autoplan.workers import Pool, can_fork
from hwprofiles.load import load_cluster
from simulator.analytic.batch import estimate_batch
from simulator.des import simulate_des
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan

PLANS = [  # schedules, ZeRO stages, offload, hybrid sharding: the DES's several program builders
    "t=4,p=4,d=4,mb=1,zero=1,v=2,schedule=interleaved",
    "t=4,p=4,d=4,mb=1,zero=1,schedule=zbv,v=2",
    "t=8,p=2,d=4,mb=1,zero=1,schedule=zbh1",
    "t=8,p=1,d=8,mb=1,zero=3,offload=cpu,ckpt=full",
    "t=4,p=1,d=16,mb=2,zero=3,hsdp=2,ckpt=selective",
]


def _garbage_cycles(work) -> int:
    """Objects in reference cycles that ``work`` left unreachable (run once before, so that caches
    and first imports are not counted)."""
    work()
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        work()
        return gc.collect()
    finally:
        if was_on:
            gc.enable()


@pytest.mark.parametrize("text", PLANS)
def test_the_des_makes_no_reference_cycles(text: str) -> None:
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", 8)
    plan, _ = parse_plan(text, model, cluster.num_gpus, 64)
    job = Job(model, cluster, plan, 64)
    assert _garbage_cycles(lambda: simulate_des(job).extra.pop("_des")) == 0


def test_scoring_makes_no_reference_cycles() -> None:
    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 2)
    layouts = list(space.shapes(model, cluster.num_gpus, 64, {}))
    precs = space.precisions(cluster.gpu, {})

    def score() -> None:
        estimate_batch(model, cluster, space.plan_table(model, layouts, {}, cluster.gpus_per_node, precs), 64)

    assert _garbage_cycles(score) == 0


def _collector_on(_: object) -> bool:
    return gc.isenabled()


def test_workers_run_with_the_collector_off_and_the_parent_keeps_it() -> None:
    if not can_fork():
        pytest.skip("no fork start method")
    assert gc.isenabled()
    with Pool(2) as pool:
        assert list(pool.imap(_collector_on, range(4))) == [False] * 4
    assert gc.isenabled()
