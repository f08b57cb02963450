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

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hwprofiles.schema import ClusterSpec
from simulator.analytic.batch.estimate import BatchEstimate
from simulator.analytic.batch.plans import PlanColumns
from simulator.analytic.batch.staged import PartEstimate, PlanMemory, PricedEstimate, StagedEstimate, estimate_view
from simulator.analytic.batch.stages import plan_stages
from simulator.cost.rank_view import rank_model, rank_plan
from simulator.plan import Plan
from simulator.plan.table import PlanTable
from simulator.runtime_spec import OVERLAPPED, Runtime
from simulator.specs import ModelSpec

__all__ = ["BatchEstimate", "GroupedEstimate", "PlanMemory", "estimate_batch", "estimate_groups", "staged_groups"]


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


@dataclass(frozen=True)
class GroupedEstimate:
    """The staged estimate (simulator.analytic.batch.staged) of plans estimated in groups, one per
    runtime (:func:`staged_groups`), each figure on demand for any rows (positions among all)."""

    size: int
    parts: list[tuple[np.ndarray, PartEstimate]]  # (positions, their estimate)

    @functools.cached_property
    def _where(self) -> tuple[np.ndarray, np.ndarray]:
        """(each plan's part, its row in it)."""
        part_of, local_of = np.empty(self.size, np.int64), np.empty(self.size, np.int64)
        for k, (positions, _) in enumerate(self.parts):
            part_of[positions], local_of[positions] = k, np.arange(len(positions))
        return part_of, local_of

    def _per_row(self, rows: np.ndarray, figure: Callable[[PartEstimate, np.ndarray], np.ndarray]) -> np.ndarray:
        """``figure`` of each part for its plans among ``rows`` (their rows in it), in ``rows``' order."""
        part_of, local_of = self._where
        which = part_of[rows]
        out = np.empty(len(rows))
        for k, (_, part) in enumerate(self.parts):
            mine = np.flatnonzero(which == k)
            if len(mine):
                out[mine] = figure(part, local_of[rows[mine]])
        return out

    def floor(self, rows: np.ndarray) -> np.ndarray:
        """Per plan of ``rows``: a floor under its step time."""
        return self._per_row(rows, lambda part, local: part.floor(local))

    def memory(self) -> PlanMemory:
        """:class:`PlanMemory` of every plan."""
        peak, gpu_ok, fits = np.empty(self.size), np.empty(self.size, bool), np.empty(self.size, bool)
        for positions, part in self.parts:
            m = part.memory()
            peak[positions], gpu_ok[positions], fits[positions] = m.peak, m.gpu_ok, m.fits
        return PlanMemory(peak, gpu_ok, fits)

    def step_times(self, rows: np.ndarray) -> np.ndarray:
        """The step times of the plans of ``rows`` (each fitting in GPU memory)."""
        return self._per_row(rows, lambda part, local: part.step_times(local))

    def priced(self) -> BatchEstimate:
        """Every plan's step time (inf where it does not fit in GPU memory), peak memory and fit."""
        step, peak, fits = np.empty(self.size), np.empty(self.size), np.empty(self.size, dtype=bool)
        for positions, part in self.parts:
            r = part.priced()
            step[positions], peak[positions], fits[positions] = r.step_time, r.peak_memory, r.fits
        return BatchEstimate(step, peak, fits)


def staged_groups(
    model: ModelSpec,
    cluster: ClusterSpec,
    plans: PlanTable,
    global_batch: int,
    groups: Sequence[tuple[Runtime, np.ndarray]],
) -> GroupedEstimate:
    """:class:`GroupedEstimate` of each group's plans (their positions in ``plans``) with the
    group's runtime. The plans' columns, stages and schedule counts, which no runtime changes, are
    made once for all groups (simulator.analytic.batch.stages.plan_stages). Where some plan has
    context or expert parallelism, every plan is priced whole, each on its rank view
    (:func:`estimate_batch`), and its floor is its step time."""
    parts: list[tuple[np.ndarray, PartEstimate]] = []
    if _views(plans) != {(1, 1)}:
        for runtime, rows in groups:
            parts.append(
                (rows, PricedEstimate(estimate_batch(model, cluster, plans.take(rows), global_batch, runtime)))
            )
        return GroupedEstimate(len(plans), parts)
    order = np.concatenate([rows for _, rows in groups])  # the plans group by group: each group a slice
    whole = len(groups) == 1 and np.array_equal(order, np.arange(len(plans)))  # one group of every plan, in order
    shared = plan_stages(model, PlanColumns(plans if whole else plans.take(order), global_batch))
    start = 0
    for runtime, rows in groups:
        stop = start + len(rows)
        part = shared if whole else shared.take(slice(start, stop))
        parts.append((rows, StagedEstimate(model, cluster, global_batch, runtime, part)))
        start = stop
    return GroupedEstimate(len(plans), parts)


def estimate_groups(
    model: ModelSpec,
    cluster: ClusterSpec,
    plans: PlanTable,
    global_batch: int,
    groups: Sequence[tuple[Runtime, np.ndarray]],
) -> BatchEstimate:
    """:func:`estimate_batch` of each group's plans (their positions in ``plans``) with the group's
    runtime, put back in the plans' order (:func:`staged_groups`, every fitting plan priced)."""
    return staged_groups(model, cluster, plans, global_batch, groups).priced()
