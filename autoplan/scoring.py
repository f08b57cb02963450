"""Step 2 of the search: the analytic estimate of every candidate plan, in the worker pool.

Plans are scored in chunks by :func:`simulator.analytic.batch.estimate_batch` (the analytic
model over arrays; :func:`simulator.analytic.estimate` is its scalar reference). Chunks are
contiguous runs of the enumeration, which lists a layout's memory variants together, so a
worker computes each layout's stage costs once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.workers import SHARED, Pool, progress
from simulator.analytic.batch import estimate_batch
from simulator.plan import Plan

#: plans per task sent to a worker
CHUNK = 8192


@dataclass
class Scored:
    """A plan's analytic score: step time (inf when it does not fit in GPU memory), peak memory, fits."""

    plan: Plan
    nodes: int
    step_time: float
    peak_memory: float
    fits: bool


def _score_chunk(args: tuple[int, int, int]) -> list[tuple[float, float, bool]]:
    """(step time, peak memory, fits) of plans ``start:stop`` of those on ``nodes`` nodes
    (:data:`SHARED` ``["plans"][nodes]``, inherited by the forked workers)."""
    nodes, start, stop = args
    plans = SHARED["plans"][nodes][start:stop]
    r = estimate_batch(SHARED["model"], SHARED["clusters"][nodes], plans, SHARED["B"], SHARED["opts"].runtime)
    return list(zip(r.step_time.tolist(), r.peak_memory.tolist(), r.fits.tolist()))


def score_all(
    todo: list[tuple[int, Plan]], jobs: int, show_progress: bool, meanwhile: Callable[[], None] | None = None
) -> list[Scored]:
    """The analytic score of each (node count, plan) in ``todo``, in order; :data:`SHARED` holds
    the model, clusters, batch and options. Worker processes pay off from two chunks of plans.
    ``meanwhile``: work for the otherwise idle parent process while the workers score (run in a
    thread started after the workers are forked and joined before returning, so no later fork
    copies it half done)."""
    by_nodes: dict[int, list[Plan]] = {}
    for n, p in todo:
        by_nodes.setdefault(n, []).append(p)
    SHARED["plans"] = by_nodes
    tasks = [(n, i, min(i + CHUNK, len(ps))) for n, ps in sorted(by_nodes.items()) for i in range(0, len(ps), CHUNK)]
    bar = progress(len(todo), show_progress, "estimating plans")
    results: dict[tuple[int, int, int], list[tuple[float, float, bool]]] = {}
    with Pool(jobs if len(tasks) > 1 else 1) as pool:
        side = threading.Thread(target=meanwhile, daemon=True) if meanwhile and pool.pool else None
        if side:
            side.start()
        for task, res in zip(tasks, pool.imap(_score_chunk, tasks)):
            results[task] = res
            bar.update(task[2] - task[1])
        if side:
            side.join()
    bar.close()
    scores = {n: iter([s for task in tasks if task[0] == n for s in results[task]]) for n in by_nodes}
    return [Scored(p, n, *next(scores[n])) for n, p in todo]
