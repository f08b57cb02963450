"""Step 2 of the search: the analytic estimate of every candidate plan, in the worker pool.

Memory first (:func:`simulator.analytic.memory_only`): most plans of a large model stop there;
the rest get the analytic step time (:func:`simulator.analytic.estimate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.workers import SHARED, Pool, progress
from simulator.analytic import estimate, memory_only
from simulator.job import Job
from simulator.plan import Plan

#: plans per task sent to a worker
CHUNK = 2000


@dataclass
class Scored:
    """A plan's analytic score: step time, peak memory, fits."""

    plan: Plan
    nodes: int
    step_time: float
    peak_memory: float
    fits: bool


def _score_chunk(args: tuple[int, Sequence[Plan]]) -> list[tuple[float, float, bool]]:
    """(step time, peak memory, fits) of each plan of one chunk on ``nodes`` nodes."""
    nodes, plans = args
    model, B = SHARED["model"], SHARED["B"]
    cluster = SHARED["clusters"][nodes]
    cap = cluster.gpu.usable_memory_bytes
    out = []
    for plan in plans:
        job = Job(model, cluster, plan, B, SHARED["opts"].runtime)
        peak = memory_only(job)  # memory first: most plans stop here
        if peak > cap:
            out.append((math.inf, peak, False))
            continue
        r = estimate(job)
        out.append((r.step_time, r.peak_memory, r.fits))
    return out


def score_all(todo: list[tuple[int, Plan]], jobs: int, show_progress: bool) -> list[Scored]:
    """The analytic score of each (node count, plan) in ``todo``, in order; :data:`SHARED` holds
    the model, clusters, batch and options. Worker processes only pay off for more than four
    chunks of plans."""
    batches: list[tuple[int, list[Plan]]] = []
    for nodes in sorted({n for n, _ in todo}):
        plans = [p for n, p in todo if n == nodes]
        batches += [(nodes, plans[i : i + CHUNK]) for i in range(0, len(plans), CHUNK)]
    bar = progress(len(todo), show_progress)
    results: list[list[tuple[float, float, bool]]] = []
    with Pool(jobs if len(todo) > 4 * CHUNK else 1) as pool:
        for (_, plans), res in zip(batches, pool.imap(_score_chunk, batches)):
            results.append(res)
            bar.update(len(plans))
    bar.close()
    scored = []
    for (nodes, plans), res in zip(batches, results):
        scored += [Scored(p, nodes, *r) for p, r in zip(plans, res)]
    return scored
