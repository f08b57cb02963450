"""The batch estimate in stages, each on demand: a plan's memory, a floor under its step time
(cheap: once per distinct :data:`TERMS_KEY`), its step time. The planner's plain search asks for
every plan's memory and every fitting plan's step time (:meth:`StagedEstimate.priced`); a search
that needs only its fastest plans (a sweep's sizes: autoplan.scoring) asks for every plan's memory,
the floors of those that fit, and the step times of those whose floor could put them among them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hwprofiles.schema import ClusterSpec
from simulator.analytic.batch.estimate import BatchEstimate, peak_memory, step_times
from simulator.analytic.batch.plans import PlanColumns, group_codes
from simulator.analytic.batch.stages import BLOCK_KEY, SPLIT_KEY, PlanStages, StageShapes, plan_stages, stage_max
from simulator.analytic.batch.terms import StageTerms, stage_terms, step_floor
from simulator.cost.step import host_fits, host_state_bytes, local_params
from simulator.plan import Plan
from simulator.runtime_spec import Runtime
from simulator.specs import ModelSpec

#: what a plan's stage terms depend on (simulator.analytic.batch.terms.stage_terms): its
#: layer-level times (stages.BLOCK_KEY), its devices' kinds (stages.SPLIT_KEY), its fp8 parameter
#: gathers (the casts) and d (with mb, the microbatches; whether its pipeline sends cross nodes;
#: on a CPU node the ranks computing at once): not its ZeRO stage, offload or hybrid sharding
TERMS_KEY = (*BLOCK_KEY, *SPLIT_KEY, "fp8ag", "d")


class PartEstimate(Protocol):
    """An estimate of a batch of plans asked figure by figure (:class:`StagedEstimate`,
    :class:`PricedEstimate`); rows are positions among its plans."""

    def floor(self, rows: np.ndarray) -> np.ndarray: ...
    def memory(self) -> PlanMemory: ...
    def step_times(self, rows: np.ndarray) -> np.ndarray: ...
    def priced(self) -> BatchEstimate: ...


@dataclass(frozen=True)
class PlanMemory:
    """Per plan: peak GPU memory, whether it fits in GPU memory (``gpu_ok``: it has a step time) and
    whether GPU and host memory both fit (``fits``)."""

    peak: np.ndarray
    gpu_ok: np.ndarray
    fits: np.ndarray


@dataclass(frozen=True)
class StagedEstimate:
    """The analytic estimate of the plans of ``X`` with the runtime ``runtime``, each stage on
    demand (module docstring); rows are positions among those plans."""

    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    runtime: Runtime
    X: PlanStages

    #: the stage terms of the distinct TERMS_KEY of the rows last floored (:meth:`floor`): (each
    #: plan's position among them, -1 where not among them; the terms), in a list the frozen
    #: estimate can refill
    _terms: list[tuple[np.ndarray, StageTerms]] = field(default_factory=list, repr=False, compare=False)

    def floor(self, rows: np.ndarray) -> np.ndarray:
        """Per plan of ``rows``: a floor under its step time (simulator.analytic.batch.terms.
        step_floor), computed once per distinct :data:`TERMS_KEY`; the terms kept for the step
        times of those rows (:meth:`step_times`)."""
        first, inverse = group_codes(*self.X.plans.key_codes(TERMS_KEY, rows))
        keyed = rows[first]
        terms = stage_terms(self.model, self.cluster, self.X.plans.take(keyed), self.X.shapes.take(keyed), self.runtime)
        position = np.full(len(self.X.plans.plans), -1, dtype=np.int64)
        position[rows] = inverse
        self._terms[:] = [(position, terms)]
        return step_floor(terms)[inverse]

    def memory(self) -> PlanMemory:
        """:class:`PlanMemory` of every plan."""
        X = self.X
        peak = peak_memory(self.model, self.cluster, X, self.runtime)
        P, node = X.plans, self.cluster.node
        offloaded, nvme = ~P.is_("offload", "none"), P.is_("offload", "nvme")
        host_ok = host_fits(
            node, host_state_bytes(node.gpus_per_node, _psi_local(P, X.shapes), P.zero), offloaded, nvme
        )
        gpu_ok = peak <= self.cluster.gpu.usable_memory_bytes
        return PlanMemory(peak, gpu_ok, gpu_ok & host_ok)

    def step_times(self, rows: np.ndarray | None) -> np.ndarray:
        """The step times of the plans of ``rows`` (None: of all), each fitting in GPU memory."""
        P, shapes = self.X.plans, self.X.shapes
        if rows is not None:  # the plans and stages read, not the schedule counts (memory only)
            P, shapes = P.take(rows), shapes.take(rows)
        terms = self._floored_terms(rows, P)
        if terms is None:
            terms = stage_terms(self.model, self.cluster, P, shapes, self.runtime)
        return step_times(self.model, self.cluster, terms, self.global_batch, self.runtime, _psi_local(P, shapes))

    def _floored_terms(self, rows: np.ndarray | None, P: PlanColumns) -> StageTerms | None:
        """The stage terms of the plans ``P`` (those of ``rows``) taken from the last floor's, when it
        floored every one of them (None otherwise)."""
        if rows is None or not self._terms:
            return None
        position, terms = self._terms[0]
        at = position[rows]
        return terms.take(at, P) if (at >= 0).all() else None

    def priced(self) -> BatchEstimate:
        """Every plan's memory, and the step time of those that fit in GPU memory (inf for the
        others, as the planner scores them): most of a search's plans do not (63% of gpt3-175b's
        on 1,024 A100s, 86% of gpt-1t's on 3,072)."""
        mem = self.memory()
        step = np.full(len(mem.peak), np.inf)
        rows = np.flatnonzero(mem.gpu_ok)
        if len(rows):
            step[rows] = self.step_times(None if len(rows) == len(step) else rows)
        return BatchEstimate(step, mem.peak, mem.fits)


@dataclass(frozen=True)
class PricedEstimate:
    """A batch whose figures are all known (plans with context or expert parallelism, priced on
    their rank view), asked as a :class:`StagedEstimate`: its floor is its step time."""

    estimate: BatchEstimate

    def floor(self, rows: np.ndarray) -> np.ndarray:
        return self.estimate.step_time[rows]

    def memory(self) -> PlanMemory:
        r = self.estimate
        return PlanMemory(r.peak_memory, np.isfinite(r.step_time), r.fits)

    def step_times(self, rows: np.ndarray) -> np.ndarray:
        return self.estimate.step_time[rows]

    def priced(self) -> BatchEstimate:
        return self.estimate


def _psi_local(P: PlanColumns, shapes: StageShapes) -> np.ndarray:
    """Per plan of ``P`` (its stages ``shapes``): the parameters whose optimizer state its busiest
    rank steps (simulator.cost.step.local_params of its largest stage)."""
    psi = stage_max(np.where(shapes.valid, shapes.params, -np.inf))
    psi_sharded = stage_max(np.where(shapes.valid, shapes.sharded_params, -np.inf))
    return local_params(psi, P.zero, P.shard_group, psi_sharded)


def estimate_view(
    model: ModelSpec, cluster: ClusterSpec, plans: Sequence[Plan], global_batch: int, runtime: Runtime
) -> BatchEstimate:
    """The step time, peak memory and fit of plans without context or expert parallelism (or of
    their rank view: simulator.cost.rank_view): :meth:`StagedEstimate.priced`."""
    X = plan_stages(model, PlanColumns(plans, global_batch))
    return StagedEstimate(model, cluster, global_batch, runtime, X).priced()
