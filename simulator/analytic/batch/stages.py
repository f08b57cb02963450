"""Each plan's distinct pipeline stages as (plans x G) arrays, G the most any plan has: the batch
estimate's form of simulator.cost.stage.stage_groups, with the stages' activations at their peak.

What depends on few plan fields is computed once per distinct key by the scalar rule that owns it
and broadcast: the kinds of a layout's devices (stage.device_kinds, stage.kind_groups; key p, v,
schedule, ckpt, layer split), the layer-level times (block_times.block_times; key t, sp, mb, prec), the
schedule's in-flight counts (simulator.cost.memory, plus m). The stages' times and activations are
then the shared rules over arrays: simulator.cost.stage.stage_times, simulator.cost.params.
stage_params, simulator.cost.stage_memory.held_activations and activation_bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, Self

import numpy as np

from hwprofiles.schema import AttentionKernel, ClusterSpec
from simulator.analytic.batch.memo import memo
from simulator.analytic.batch.plans import PlanColumns, Rows, take_rows
from simulator.cost import memory, params
from simulator.cost.block_times import BlockTimes, block_times_table, busy_ranks, host_async
from simulator.cost.ops import dtype_bytes
from simulator.cost.pass_time import PassTimes
from simulator.cost.phase_memory import recompute_working_set
from simulator.cost.precision import linear_input_bytes
from simulator.cost.stage import StageSpans, device_kinds, kind_groups, stage_groups, stage_times
from simulator.cost.stage_memory import activation_bytes, activation_peak, held_activations, layer_activations
from simulator.cost.workload import padded_vocab_size
from simulator.plan import Plan
from simulator.runtime_spec import CrossEntropy, LayerKernels
from simulator.specs import ModelSpec

#: what a plan's pipeline devices' kinds depend on (simulator.cost.stage.device_kinds)
SPLIT_KEY = ("p", "v", "ckpt", "layers", "recompute", "schedule")
#: what the layer-level times depend on (simulator.cost.block_times.block_times)
BLOCK_KEY = ("t", "sp", "mb", "prec")
#: and on a node whose ranks share its processor, how many compute at once (block_times.busy_ranks)
BUSY_KEY = ("p", "v", "m", "schedule")
_BLOCK_FIELDS_NAMES = (
    "layer.forward",
    "layer.backward",
    "layer.backward_weight",
    "layer.attention_core",
    "embedding.forward",
    "embedding.backward",
    "embedding.backward_weight",
    "head.forward",
    "head.backward",
    "head.backward_weight",
    "tp_all_reduce",
    "cp_forward",
    "cp_backward",
    "fp8_weight_cast",
    "ep_all_to_all",
    "loss_comm",
)
_BLOCK_FIELDS = attrgetter(*_BLOCK_FIELDS_NAMES)


def by_key(per: list, inverse: np.ndarray) -> np.ndarray:
    """Each plan's tuple of :meth:`PlanColumns.per_key` values (``per``, ``inverse``), as one
    row per tuple field (fields x plans, each field's row contiguous)."""
    return np.ascontiguousarray(np.array(per, dtype=float).T).take(inverse, axis=1)


def column(values: Any) -> Any:
    """A per-plan array as a column beside the stages (plans x 1)."""
    return values[:, None]


def stage_max(values: np.ndarray) -> np.ndarray:
    """Each plan's largest over its stages (``values.max(axis=1)`` of a plans x G array), the G
    columns combined one by one: numpy reduces a short last axis several times slower (a 102,462 x
    4 array on the project's 2-core VM: 3.9 ms against 0.65 ms)."""
    out = values[:, 0].copy()
    for j in range(1, values.shape[1]):
        np.maximum(out, values[:, j], out=out)
    return out


@dataclass(frozen=True)
class StageShapes:
    """Each plan's distinct stages without their times (what the memory estimate reads): the first
    device of each (``dev``), the devices it stands for (``count``), which slots are real
    (``valid``), and simulator.cost.stage.StageCost's layer and parameter fields as plans x G arrays."""

    valid: np.ndarray
    dev: np.ndarray
    count: np.ndarray
    layers: np.ndarray
    full_layers: np.ndarray
    selective_layers: np.ndarray
    first: np.ndarray
    last: np.ndarray
    turn: np.ndarray
    params: np.ndarray
    sharded_params: np.ndarray
    layer_params: np.ndarray  # the stage's transformer layers' parameters on one rank
    layer_params_each: np.ndarray  # one layer's (plans x 1)

    def take(self, rows: Rows) -> Self:
        """The stages of the plans of ``rows``, in that order (with their times, of
        :class:`StageArrays`)."""
        return type(self)(**{f.name: take_rows(getattr(self, f.name), rows) for f in fields(self)})


@dataclass(frozen=True)
class StageArrays(StageShapes, StageSpans):
    """Each plan's distinct stages with their per-microbatch times (StageCost's time fields;
    ``total``, ``forward_span`` and ``backward_span`` from StageSpans)."""

    forward: np.ndarray
    backward: np.ndarray
    backward_weight: np.ndarray
    recompute: np.ndarray
    tp_comm: np.ndarray
    cp_comm: np.ndarray
    ep_comm: np.ndarray
    forward_comm: np.ndarray
    weight_cast: np.ndarray


def _block_arrays(times: np.ndarray) -> BlockTimes:
    """BlockTimes whose fields are the plans' columns (``times``: field x plans x 1)."""
    lf, lb, lbw, lac, ef, eb, ebw, hf, hb, hbw, ar, cpf, cpb, cast, ep, loss = times
    return BlockTimes(
        layer=PassTimes(lf, lb, lac, lbw),
        embedding=PassTimes(ef, eb, 0.0, ebw),
        head=PassTimes(hf, hb, 0.0, hbw),
        tp_all_reduce=ar,
        act_bytes=0.0,
        cp_forward=cpf,
        cp_backward=cpb,
        fp8_weight_cast=cast,
        ep_all_to_all=ep,
        loss_comm=loss,
    )


def _rank_params(model: ModelSpec, t: int) -> tuple[float, float, float]:
    """A layer's parameters on one TP rank, the experts' states it shards beyond them, the
    embedding's (simulator.cost.params, with Megatron's padded vocabulary)."""
    vocab = padded_vocab_size(model, t)
    return (
        params.layer_params_per_rank(model, t),
        params.layer_sharded_extra(model, t),
        params.embedding_params_per_rank(model, t, vocab),
    )


def busy_column(cluster: ClusterSpec, P: PlanColumns) -> np.ndarray | None:
    """Each plan's ranks computing at once where the node's ranks share its processor
    (simulator.cost.block_times.busy_ranks, per distinct :data:`BUSY_KEY`); None on a GPU node."""
    if host_async(cluster):
        return None
    return P.per_plan(BUSY_KEY, lambda q, i: busy_ranks(cluster, q, int(P.m[i])) or 0.0)


def _plan_block_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    P: PlanColumns,
    kernels: LayerKernels,
    attention: AttentionKernel,
    loss: Callable[[int], CrossEntropy],
    busy: np.ndarray | None,
) -> BlockTimes:
    """Each plan's layer-level times (simulator.cost.block_times, which caches them per cluster) as
    columns (plans x 1), computed once per distinct (t, sp, mb, prec), with the cross-entropy
    ``loss`` of its t (Runtime.loss), and per distinct :data:`BUSY_KEY` where the node's ranks
    share its processor (``busy``: :func:`busy_column`): the times depend on how many compute at
    once."""
    names = BLOCK_KEY if busy is None else BLOCK_KEY + BUSY_KEY
    keys, first, block_of = P.distinct(names)
    blocks = block_times_table(
        model,
        cluster,
        [(t, bool(sp), mb, prec) for t, sp, mb, prec, *_ in keys],
        kernels,
        attention,
        None if busy is None else busy[first].tolist(),
        [loss(t) for t, *_ in keys],
    )
    table = np.empty((len(_BLOCK_FIELDS_NAMES), len(keys)))
    for row, values in zip(table, _BLOCK_FIELDS(blocks)):
        row[:] = values  # an array over the keys, or one number for all
    return _block_arrays(table.take(block_of, axis=1)[:, :, None])


def stage_shapes(model: ModelSpec, P: PlanColumns) -> StageShapes:
    """Each plan's distinct stages (module docstring): the devices' kinds of each split and the
    stages' parameters on one rank."""
    L = model.num_layers
    groups, split_of = P.per_key(SPLIT_KEY, lambda q, i: kind_groups(device_kinds(q, L)), memo((model,), "kinds"))
    width = max(map(len, groups))
    key, slot = np.array([(k, j) for k, gs in enumerate(groups) for j in range(len(gs))]).T
    rows = np.array([(dev, count, *kind) for gs in groups for dev, kind, count in gs], dtype=float).T
    table = np.zeros((5, len(groups), width))  # dev, count, and the kind's layer counts (n, full, sel)
    table[:, key, slot] = rows[:5]
    ends = np.zeros((3, len(groups), width), dtype=bool)  # the kind's first, last and turn, taken as booleans
    ends[:, key, slot] = rows[5:]
    valid = np.zeros((len(groups), width), dtype=bool)
    valid[key, slot] = True
    dev, count, n, full, sel = table.take(split_of, axis=1)
    first, last, turn = ends.take(split_of, axis=1)
    per_t, t_of = P.per_key(("t",), lambda q, i: _rank_params(model, q.t), memo((model,), "rank params"))
    layer_p, sharded_extra, emb_p = by_key(per_t, t_of)[:, :, None]
    head_p = P.per_plan(
        ("t", "p"),
        lambda q, i: params.head_params_per_rank(model, q.t, q.p, padded_vocab_size(model, q.t)),
        memo((model,), "head params"),
    )
    stage_p = params.stage_params(n, first, last, layer_p, emb_p, head_p[:, None])
    return StageShapes(
        valid=valid.take(split_of, axis=0),
        dev=dev,
        count=count,
        layers=n,
        full_layers=full,
        selective_layers=sel,
        first=first,
        last=last,
        turn=turn,
        params=stage_p,
        # StageShape.sharded_params: the same array where no plan has extra sharded parameters (exact)
        sharded_params=stage_p + n * sharded_extra if sharded_extra.any() else stage_p,
        layer_params=n * layer_p,
        layer_params_each=layer_p,
    )


def stage_arrays(
    model: ModelSpec,
    cluster: ClusterSpec,
    P: PlanColumns,
    shapes: StageShapes,
    kernels: LayerKernels,
    attention: AttentionKernel,
    loss: Callable[[int], CrossEntropy],
    busy: np.ndarray | None = None,
) -> StageArrays:
    """The stages of ``shapes`` (:func:`stage_shapes` of the plans ``P``) with their times: the
    layer-level times of each (t, sp, mb, prec) with the layer's kernels, attention kernel and
    cross-entropy (``loss`` of t: Runtime.loss), combined by simulator.cost.stage.stage_times;
    ``busy``: each plan's ranks computing at once on a node whose ranks share its processor
    (:func:`busy_column`, which a CPU node needs; None on a GPU node)."""
    bt = _plan_block_times(model, cluster, P, kernels, attention, loss, busy)
    times = stage_times(
        model, bt, shapes.layers, shapes.full_layers, shapes.selective_layers, shapes.first, shapes.last
    )
    return StageArrays(**{f.name: getattr(shapes, f.name) for f in fields(StageShapes)}, **times._asdict())


@dataclass(frozen=True)
class ScheduleCounts:
    """Per plan and stage, what its pipeline schedule fixes (simulator.cost.memory): the
    microbatches in flight, the weight gradients owed at that peak (ZB-H1), and the embedding's
    and the head's chunk's microbatches in flight."""

    in_flight: np.ndarray
    weight_grads_pending: np.ndarray
    embedding_in_flight: np.ndarray
    head_in_flight: np.ndarray

    def take(self, rows: Rows) -> ScheduleCounts:
        """The counts of the plans of ``rows``, in that order."""
        return ScheduleCounts(**{f.name: take_rows(getattr(self, f.name), rows) for f in fields(ScheduleCounts)})


@dataclass(frozen=True)
class PlanStages:
    """Plans as columns with their distinct stages and their schedule's counts: what the batch
    estimate reads that depends on the model and the plans alone, neither the cluster nor the
    runtime (made once for a search's plans and taken for each runtime group: :func:`plan_stages`)."""

    plans: PlanColumns
    shapes: StageShapes
    counts: ScheduleCounts

    def take(self, rows: Rows) -> PlanStages:
        """The plans of ``rows``, in that order."""
        return PlanStages(self.plans.take(rows), self.shapes.take(rows), self.counts.take(rows))


def plan_stages(model: ModelSpec, P: PlanColumns) -> PlanStages:
    """:class:`PlanStages` of the plans ``P`` of ``model``."""
    shapes = stage_shapes(model, P)
    return PlanStages(P, shapes, schedule_counts(model, P, shapes))


def schedule_counts(model: ModelSpec, P: PlanColumns, S: StageShapes) -> ScheduleCounts:
    """:class:`ScheduleCounts` of each plan's stages (``S``: the stages of the plans ``P`` of
    ``model``), computed per split and m."""
    width = S.valid.shape[1]

    def counts(i: int) -> np.ndarray:
        devices = tuple(S.dev[i, : int(S.valid[i].sum())].astype(int).tolist())
        return _split_counts(P.value_of("schedule", i), int(P.p[i]), int(P.m[i]), int(P.v[i]), devices)

    per, inv = P.per_row_key((*SPLIT_KEY, "m"), counts, memo((model,), "schedule counts"))
    by_field = np.ascontiguousarray(padded_rows(per, width).transpose(2, 0, 1))  # each field's rows contiguous
    return ScheduleCounts(*by_field.take(inv, axis=1))


def padded_rows(per: list[np.ndarray], width: int) -> np.ndarray:
    """The arrays ``per`` (each n_k x f, n_k <= ``width``) as one (len(per) x width x f) array,
    each padded with zeros after its n_k rows."""
    lengths = np.fromiter(map(len, per), np.int64, len(per))
    flat = np.concatenate(per)
    out = np.zeros((len(per), width, flat.shape[1]))
    key = np.repeat(np.arange(len(per)), lengths)
    out[key, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = flat
    return out


@functools.lru_cache(maxsize=65536)
def _split_counts(schedule: str, p: int, m: int, v: int, devices: tuple[int, ...]) -> np.ndarray:
    """The :func:`_device_counts` of each of ``devices`` (a split's first device of each kind), one
    row each (cached: the splits that differ in their recomputation alone have the same devices)."""
    return np.array([_device_counts(schedule, dev, p, m, v) for dev in devices], dtype=float)


@functools.lru_cache(maxsize=65536)
def _device_counts(schedule: str, dev: int, p: int, m: int, v: int) -> tuple[float, float, float, float]:
    """One device's :class:`ScheduleCounts` (cached: the splits of one schedule, p, m and v, and
    the sizes of a sweep that give the same m, ask for the same devices again)."""
    return (
        memory.in_flight_microbatches(schedule, dev, p, m, v),
        memory.weight_grads_pending(schedule, dev, p, m),
        memory.end_chunk_in_flight(schedule, dev, p, m, v, 0),
        memory.end_chunk_in_flight(schedule, dev, p, m, v, v - 1),
    )


def stage_activations(
    model: ModelSpec,
    cluster: ClusterSpec,
    P: PlanColumns,
    S: StageShapes,
    counts: ScheduleCounts,
    kernels: LayerKernels = "fused",
) -> tuple[np.ndarray, np.ndarray]:
    """simulator.cost.stage_memory.activation_peak of each plan's stages, the layers running
    ``kernels``, and each stage's recompute working set (phase_memory.recompute_working_set).
    Equal chunks (the search's plans): its rules over arrays (held_activations, activation_bytes);
    chunks that differ (v > 1 with an explicit split): the scalar rule, plan by plan."""
    e = dtype_bytes(cluster.gpu)
    s, h = model.seq_length, model.hidden_size

    def per_layer(q: Plan, i: int) -> tuple[float, ...]:
        sp = bool(q.sp)
        li = linear_input_bytes(q.prec, e)
        return (
            *layer_activations(model, q.mb, q.t, sp, e, q.prec, kernels),
            memory.weight_grad_input_bytes(model, q.mb, q.t, sp, li),  # stage_memory.pending_weight_inputs
            memory.embedding_activation_bytes(q.mb, s, h, q.t, sp),
        )

    per, inv = P.per_key(("t", "sp", "mb", "prec"), per_layer, memo((model, cluster.gpu), ("activations", kernels)))
    pf, ps, pn, w_in, emb = by_key(per, inv)[:, :, None]
    n, full, sel = S.layers, S.full_layers, S.selective_layers
    occupied = held_activations(counts.in_flight, n, full, sel, pf, ps, pn)
    gpipe_kept = (P.is_("schedule", "gpipe") & (P.m > 1))[:, None]
    pending = counts.weight_grads_pending * w_in  # stage_memory.pending_weight_inputs
    act = activation_bytes(
        occupied, n, full, sel, (pf, ps, pn), gpipe_kept, pending, S.first, counts.embedding_in_flight * emb
    )
    uneven = (P.v > 1) & ~(P.is_("layers", None) & P.is_("recompute", None))
    for i in np.flatnonzero(uneven).tolist():
        q, m = P.plans[i], int(P.m[i])
        for j, (dev, c, _) in enumerate(stage_groups(model, cluster, q)):
            act[i, j] = activation_peak(model, cluster, q, m, dev, c, kernels)
    return np.where(S.valid, act, 0.0), np.where(S.valid, recompute_working_set(full, pn), 0.0)
