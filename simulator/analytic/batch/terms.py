"""What a batch of plans' step times read per microbatch of each stage before their data-parallel
and sharded-state traffic (:class:`StageTerms`), and the floor under the step time it gives
(:func:`step_floor`): the planner prices only the plans whose floor could put them among its
fastest where it needs no other (autoplan.scoring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hwprofiles.schema import ClusterSpec
from simulator.analytic.batch.plans import PlanColumns, take_rows
from simulator.analytic.batch.stages import StageArrays, StageShapes, busy_column, column, stage_arrays, stage_max
from simulator.analytic.pipeline import ScheduleKind, p2p_seconds, p2p_sends, pipeline_floor, stage_microbatch
from simulator.cost.precision import weight_cast_seconds
from simulator.runtime_spec import Runtime
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class StageTerms:
    """What the step time of plans ``plans`` reads per microbatch of each stage before their
    data-parallel and sharded-state traffic (simulator.analytic.pipeline_phase): the stages'
    times ``S``, the ranks computing at once (``busy``, CPU nodes), one pipeline send's seconds
    (``p2p``, plans x 1), the fp8 weight casts and the blocking sends per microbatch."""

    plans: PlanColumns
    S: StageArrays
    busy: np.ndarray | None
    p2p: np.ndarray
    casts: Any
    sends: np.ndarray

    def take(self, rows: np.ndarray, plans: PlanColumns) -> StageTerms:
        """The terms of rows ``rows`` given to the plans ``plans`` (one per row: plans whose
        :data:`~simulator.analytic.batch.staged.TERMS_KEY` is that row's)."""
        casts = take_rows(self.casts, rows) if np.ndim(self.casts) else self.casts
        busy = None if self.busy is None else take_rows(self.busy, rows)
        return StageTerms(plans, self.S.take(rows), busy, take_rows(self.p2p, rows), casts, take_rows(self.sends, rows))


def stage_terms(
    model: ModelSpec, cluster: ClusterSpec, P: PlanColumns, shapes: StageShapes, runtime: Runtime
) -> StageTerms:
    """:class:`StageTerms` of the plans ``P`` (their stages ``shapes``)."""
    busy = busy_column(cluster, P)  # ranks sharing a processor: the times depend on how many compute at once
    S = stage_arrays(model, cluster, P, shapes, runtime.layer_kernels, runtime.attention_kernel, runtime.loss, busy)
    keys = ("t", "sp", "mb", "p", "d")
    p2p = column(P.per_row(keys, lambda i: p2p_seconds(model, cluster, *P.ints(keys, i))))
    casts = weight_cast_seconds(runtime.fp8_weight_cache, column(P.is_("prec", "fp8")), column(P.fp8ag), S.weight_cast)
    return StageTerms(P, S, busy, p2p, casts, p2p_sends(column(P.p), column(P.v), S.first, S.last, S.turn))


def schedule_kind(P: PlanColumns) -> ScheduleKind:
    """The pipeline schedule's kind of each plan of ``P`` (simulator.analytic.pipeline.ScheduleKind)."""
    schedule = P.is_("schedule", "interleaved"), P.is_("schedule", "zbh1"), P.is_("schedule", "zbv")
    return ScheduleKind.from_flags(*schedule, P.is_("schedule", "gpipe"), P.v, P.m)


def step_floor(terms: StageTerms) -> np.ndarray:
    """Per plan of ``terms``: :func:`~simulator.analytic.pipeline.pipeline_floor` of its stages
    without their sharded-state and offload traffic (zero exposed), at most its step time
    (simulator.analytic.batch.estimate.step_times adds that traffic, the data-parallel exposure and
    the step's end, none of them negative)."""
    S, P = terms.S, terms.plans
    per_mb = np.where(S.valid, stage_microbatch(S.total, terms.casts, terms.sends, terms.p2p, 0.0), -np.inf)
    worst = stage_max(per_mb)
    total = (np.where(S.valid, per_mb, 0.0) * S.count).sum(axis=1)
    recompute = stage_max(np.where(S.valid, S.recompute, 0.0))
    return pipeline_floor(P.m, worst, total, schedule_kind(P), P.v, recompute)
