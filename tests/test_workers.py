"""The search's worker processes run with the cyclic garbage collector off (autoplan.workers.Pool):
what they run must make no reference cycles, or their memory would grow with every task."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest

from autoplan import space
from autoplan.workers import Pool, WorkerDied, can_fork
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


# ---------------------------------------------------------------- the pool's own protocol

needs_fork = pytest.mark.skipif(not can_fork(), reason="no fork start method")


def _square_or_fail(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    if x == 30:
        time.sleep(30)
    return x * x


def _sleep_then(x: float) -> float:
    time.sleep(x)
    return x


@needs_fork
def test_results_come_in_order_and_a_worker_error_is_raised_at_its_item() -> None:
    got = []
    with Pool(2) as pool:
        assert list(pool.imap(_sleep_then, [0.2, 0.0, 0.1])) == [0.2, 0.0, 0.1]  # in order, not as they end
        assert list(pool.imap(_square_or_fail, [0, 1, 2])) == [0, 1, 4]  # a pool maps again
        with pytest.raises(ValueError, match="three") as raised:
            for y in pool.imap(_square_or_fail, [0, 1, 2, 3]):
                got.append(y)
        assert got == [0, 1, 4]
        assert "in a search worker" in "".join(raised.value.__notes__)


def test_shares_deal_each_worker_its_block_then_the_largest_left() -> None:
    from autoplan.workers import _Shares

    shares = _Shares(8, 2)  # blocks 0-3 and 4-7
    dealt = [shares.deal(w) for w in (0, 1, 1, 1, 1, 1, 0, 0)]
    assert dealt == [0, 4, 5, 6, 7, 3, 1, 2]  # worker 1, done first, takes the end of worker 0's block
    assert shares.left == 0
    one = _Shares(5, 1)
    assert [one.deal(w) for w in (0, 1, 1, 0, 1)] == [0, 1, 2, 3, 4]  # one share: the next item


@needs_fork
def test_blocks_keep_the_results_in_order() -> None:
    with Pool(2) as pool:
        assert list(pool.imap(_sleep_then, [0.1, 0.0, 0.0, 0.0, 0.05], blocks=True)) == [0.1, 0.0, 0.0, 0.0, 0.05]


@needs_fork
def test_a_map_left_while_a_worker_is_busy_kills_the_workers() -> None:
    """Its answer would otherwise be taken for the next map's."""
    with Pool(2) as pool:
        workers = [w.process for w in pool.workers]
        started = time.monotonic()
        with pytest.raises(ValueError, match="three"):
            list(pool.imap(_square_or_fail, [3, 30]))  # the second worker sleeps 30 s
        assert time.monotonic() - started < 5 and all(w.exitcode is not None for w in workers)
        with pytest.raises(RuntimeError, match="closed"):
            pool.imap(_square_or_fail, [0])


@needs_fork
def test_a_map_left_early_with_its_workers_idle_leaves_the_pool_usable() -> None:
    with Pool(2) as pool:
        assert next(iter(pool.imap(_square_or_fail, [0]))) == 0  # the map, left, is closed at once
        assert list(pool.imap(_square_or_fail, [1, 2])) == [1, 4]


@needs_fork
def test_a_worker_killed_while_it_waits_for_a_task_ends_the_map_at_once() -> None:
    """multiprocessing.Pool's idle worker held the task queue's lock; killed, it hung the pool."""
    with Pool(2) as pool:
        busy, idle = (w.process for w in pool.workers)  # one task: the first worker takes it
        threading.Timer(0.3, os.kill, (idle.pid, signal.SIGKILL)).start()
        started = time.monotonic()
        with pytest.raises(WorkerDied, match=f"pid {idle.pid}.*SIGKILL"):
            next(iter(pool.imap(_sleep_then, [30.0])))
        assert time.monotonic() - started < 5
    assert busy.exitcode is not None and idle.exitcode is not None  # the busy one was killed on leaving
