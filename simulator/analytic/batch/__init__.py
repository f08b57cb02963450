"""The analytic estimate of many plans at once, over numpy arrays: the planner's scoring path.

It applies the rules of :func:`simulator.analytic.estimate` (one plan, Python numbers): each rule is
one function that takes numbers or arrays alike (simulator.numeric), called by the scalar
estimate with one plan's stage and here with every plan's stages at once (``plans x stages``
arrays). Its speed comes from splitting each rule's inputs by what they depend on:

* terms that depend on few plan fields are computed once per distinct key by the scalar rule that
  owns them and broadcast to the plans that share the key (:mod:`.plans`'s ``per_key``): the kinds
  of a layout's pipeline devices, the layer-level times, the schedule's in-flight counts
  (:mod:`.stages`), the pipeline send and tied-embedding times, the step-end scalar all-reduces and
  each group's link figures (:mod:`.links`);
* the rest, what varies with every plan (ZeRO stage, offload, hybrid sharding, d, message sizes),
  is the shared rules over arrays (:mod:`.estimate`). Plans whose chunks differ (v > 1 with an
  explicit split) take their activation peaks from the scalar rule.

The same plans give the same figures on both paths (tests/test_analytic_batch.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hwprofiles.schema import ClusterSpec
from simulator.analytic.batch.estimate import BatchEstimate, estimate_stages, estimate_view
from simulator.analytic.batch.plans import PlanColumns
from simulator.analytic.batch.stages import plan_stages
from simulator.cost.rank_view import rank_model, rank_plan
from simulator.plan import Plan
from simulator.plan.table import PlanTable
from simulator.runtime_spec import OVERLAPPED, Runtime
from simulator.specs import ModelSpec

__all__ = ["BatchEstimate", "estimate_batch", "estimate_groups"]


def _views(plans: Sequence[Plan]) -> set[tuple[int, int]]:
    """The (cp, ep) pairs of the plans."""
    if isinstance(plans, PlanTable):
        (cps, cp), (eps, ep) = plans.column("cp"), plans.column("ep")
        pairs = np.flatnonzero(np.bincount(cp * len(eps) + ep, minlength=len(cps) * len(eps)))
        return {(cps[k // len(eps)], eps[k % len(eps)]) for k in pairs.tolist()}
    return {(q.cp, q.ep) for q in plans}


def _by_view(
    model: ModelSpec,
    cluster: ClusterSpec,
    plans: Sequence[Plan],
    global_batch: int,
    runtime: Runtime,
    views: list[tuple[int, int]],
) -> BatchEstimate:
    """:func:`estimate_batch` of each (cp, ep)'s plans on their rank view, put back in the plans' order."""
    step, peak, fits = np.zeros(len(plans)), np.zeros(len(plans)), np.zeros(len(plans), dtype=bool)
    for cp, ep in views:
        idx = [i for i, q in enumerate(plans) if (q.cp, q.ep) == (cp, ep)]
        ranked = [rank_plan(plans[i]) for i in idx]
        r = estimate_view(rank_model(model, cp, ep), cluster, ranked, global_batch * cp, runtime)
        step[idx], peak[idx], fits[idx] = r.step_time, r.peak_memory, r.fits
    return BatchEstimate(step, peak, fits)


def estimate_batch(
    model: ModelSpec, cluster: ClusterSpec, plans: Sequence[Plan], global_batch: int, runtime: Runtime = OVERLAPPED
) -> BatchEstimate:
    """The analytic step time, peak memory and fit of every plan (module docstring); plans with
    context or expert parallelism priced as one rank sees them (simulator.cost.rank_view), each
    (cp, ep) apart. ``plans``: a list, or a :class:`~simulator.plan.table.PlanTable` (read as
    its columns: the search's workers)."""
    if not plans:
        empty = np.zeros(0)
        return BatchEstimate(empty, empty, np.zeros(0, dtype=bool))
    views = _views(plans)
    if views != {(1, 1)}:
        return _by_view(model, cluster, list(plans), global_batch, runtime, sorted(views))
    return estimate_view(model, cluster, plans, global_batch, runtime)


def estimate_groups(
    model: ModelSpec,
    cluster: ClusterSpec,
    plans: PlanTable,
    global_batch: int,
    groups: Sequence[tuple[Runtime, np.ndarray]],
) -> BatchEstimate:
    """:func:`estimate_batch` of each group's plans (their positions in ``plans``) with the group's
    runtime, put back in the plans' order. The plans' columns, stages and schedule counts, which
    no runtime changes, are made once for all groups (simulator.analytic.batch.stages.plan_stages)."""
    if len(groups) == 1:
        return estimate_batch(model, cluster, plans, global_batch, groups[0][0])
    step, peak, fits = np.zeros(len(plans)), np.zeros(len(plans)), np.zeros(len(plans), dtype=bool)
    if _views(plans) != {(1, 1)}:
        for runtime, rows in groups:
            r = estimate_batch(model, cluster, plans.take(rows), global_batch, runtime)
            step[rows], peak[rows], fits[rows] = r.step_time, r.peak_memory, r.fits
        return BatchEstimate(step, peak, fits)
    order = np.concatenate([rows for _, rows in groups])  # the plans group by group: each group a slice
    shared = plan_stages(model, PlanColumns(plans.take(order), global_batch))
    start = 0
    for runtime, rows in groups:
        stop = start + len(rows)
        r = estimate_stages(model, cluster, shared.take(slice(start, stop)), global_batch, runtime)
        step[rows], peak[rows], fits[rows] = r.step_time, r.peak_memory, r.fits
        start = stop
    return BatchEstimate(step, peak, fits)
