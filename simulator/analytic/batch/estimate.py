"""The analytic estimate of many plans of one rank view, over (plans x stages) arrays: the rules of
the scalar estimate (simulator.analytic), each called once with arrays, and the reductions over
each plan's stages (its critical stage, its sums over devices, its peak)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hwprofiles.schema import ClusterSpec
from simulator.analytic.batch.links import BatchLinks
from simulator.analytic.batch.memo import memo
from simulator.analytic.batch.plans import PlanColumns
from simulator.analytic.batch.stages import PlanStages, StageShapes, column, stage_activations, stage_max
from simulator.analytic.batch.terms import StageTerms, schedule_kind
from simulator.analytic.data_parallel import DpPlan, dp_exposed, dp_step_times, sharded_exposed
from simulator.analytic.offload import offload_time, zero_infinity_exposed
from simulator.analytic.pipeline import (
    pipeline_bubble,
    skipped_recompute,
    stage_microbatch,
    steady_seconds,
    tied_embedding_time,
    weight_fill,
)
from simulator.cost import memory, params, state_bytes
from simulator.cost.boundary import pipeline_buffer_bytes
from simulator.cost.fsdp2_sync import (
    deferred_sync_by,
    fsdp2_sharded_by,
    whole_grad_bytes,
    zero2_unsharded_bytes,
    zero3_gathered_bytes,
)
from simulator.cost.fsdp2_window import step_gathers
from simulator.cost.ops import dtype_bytes
from simulator.cost.phase_memory import gradients_late, phase_transient, weight_copies_held, weight_copies_saved
from simulator.cost.precision import FP8, fp8_copies_bytes, fp8_layer_bytes
from simulator.cost.stage_memory import flight_buffer_bytes, sharding_buffer_bytes, stage_peak
from simulator.cost.step import (
    dp_step_exposed,
    dtensor_params,
    optimizer_seconds,
    optimizer_tensors,
    step_end_seconds,
    step_seconds,
    step_sync_time,
)
from simulator.cost.workload import padded_vocab_size
from simulator.job import Job
from simulator.runtime_spec import CrossEntropy, Runtime
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class BatchEstimate:
    """Per plan: analytic step time (inf when the plan does not fit in GPU memory, as the
    planner scores it), peak GPU memory, and whether GPU and host memory both fit."""

    step_time: np.ndarray
    peak_memory: np.ndarray
    fits: np.ndarray


def dp_columns(P: PlanColumns, runtime: Runtime) -> DpPlan:
    """What the data-parallel rules read of the plans ``P`` (simulator.analytic.data_parallel.DpPlan),
    as columns (one row per plan, broadcast over its stages)."""
    fsdp2, deferred = fsdp2_sharded_by(P.d, P.zero, runtime), deferred_columns(P, runtime)
    gathers = np.zeros(len(P.plans))
    if deferred.any():
        keys = ("p", "m", "v", "zero")
        gathers = P.per_row(("schedule", *keys), lambda i: step_gathers(P.value_of("schedule", i), *P.ints(keys, i)))
    return DpPlan(*(column(x) for x in (P.zero, P.d, P.fp8ag, fsdp2, P.m, deferred, gathers)))


def deferred_columns(P: PlanColumns, runtime: Runtime) -> np.ndarray:
    """Per plan of ``P``: FSDP2's gradient sync deferred to the step's end
    (simulator.cost.fsdp2_sync.deferred_sync)."""
    return deferred_sync_by(P.p, P.d, P.zero, ~P.is_("offload", "none"), runtime)


def peak_memory(model: ModelSpec, cluster: ClusterSpec, X: PlanStages, runtime: Runtime) -> np.ndarray:
    """simulator.cost.stage_memory.stage_memory of each plan's stages, its worst stage's total."""
    P, S, counts = X.plans, X.shapes, X.counts
    e = dtype_bytes(cluster.gpu)
    zero, shard = column(P.zero), column(P.shard_group)
    offloaded = column(~P.is_("offload", "none"))
    by_zero = np.array(
        [state_bytes.program_state_bytes(runtime.states, e, z, runtime.scatter_gather) for z in range(4)], dtype=float
    )
    pb, gb, k = (column(by_zero[P.zero, i]) for i in range(3))
    deferred = column(deferred_columns(P, runtime))
    whole = whole_grad_bytes(deferred, runtime, e)
    unsharded = zero2_unsharded_bytes(column(P.d), zero, runtime, e)
    states = memory.model_state_bytes(S.params, shard, zero, offloaded, pb, gb, k, S.sharded_params, whole, unsharded)
    working_set = P.per_plan(
        ("t",),
        lambda q, i: memory.zero3_working_set_bytes(params.layer_params_per_rank(model, q.t), e),
        memo((model,), ("zero-3 working set", e)),
    )
    bucket = column(memory.bucket_bytes_of(runtime, P.d))
    buckets = column(P.d > 1) | offloaded
    every = runtime.dp_buckets == "all"
    gathered = zero3_gathered_bytes(column(working_set), S.params, deferred, e)
    sharding = sharding_buffer_bytes(S.params, buckets, zero == 3, gathered, bucket, every, gb)
    logits = P.per_plan(
        ("t", "mb"),
        lambda q, i: memory.logits_elements(model, q.mb, q.t, padded_vocab_size(model, q.t), runtime.loss(q.t)),
        memo((model,), ("logits", runtime.cross_entropy, runtime.tensor_parallel_cross_entropy)),
    )
    pipe = P.per_plan(
        ("mb", "p"), lambda q, i: pipeline_buffer_bytes(model, q.mb, e, q.p), memo((model, cluster.gpu), "pipe")
    )
    by_loss = _by_loss(P, runtime)
    flight = by_loss(
        lambda loss: flight_buffer_bytes(S.last, column(logits), counts.head_in_flight, loss, e, column(pipe))
    )
    fp8 = _fp8_copies(model, cluster, P, S, e) if P.is_("prec", FP8).any() or P.fp8ag.any() else 0.0
    activations, recompute = stage_activations(model, cluster, P, S, counts, runtime.layer_kernels)
    copies = runtime.weight_copy_bytes
    saved = weight_copies_saved(copies, S.params, S.full_layers * S.layer_params_each, column(P.p > 1))
    last_logits = np.where(S.last, column(logits), 0.0)
    loss_forward, loss_backward = by_loss(lambda x: memory.loss_transient_bytes(last_logits, x, e))
    transient = phase_transient(weight_copies_held(copies, S.params), saved, loss_forward, loss_backward, recompute)
    late = column(gradients_late(runtime.grads_freed, P.m, P.p, P.d, P.zero))
    peak = stage_peak(states, activations, sharding, flight, fp8, transient, late)
    return stage_max(np.where(S.valid, peak.total, -np.inf))


def _by_loss(P: PlanColumns, runtime: Runtime) -> Callable[[Callable[[CrossEntropy], Any]], Any]:
    """A rule of the cross-entropy, ``rule(loss)`` (an array or a tuple of them), taken for each
    plan of ``P`` at its own loss (Runtime.loss of its t): called once where the plans compute one
    loss, else once per loss, each plan's row chosen."""
    wide, base, tp = P.t > 1, runtime.cross_entropy, runtime.loss(2)  # loss(2): the loss at any t > 1
    if base == tp or not wide.any():
        return lambda rule: rule(base)
    if wide.all():
        return lambda rule: rule(tp)
    pick = column(wide)

    def each(rule: Callable[[CrossEntropy], Any]) -> Any:
        at_tp, at_base = rule(tp), rule(base)
        if isinstance(at_tp, tuple):
            return tuple(np.where(pick, a, b) for a, b in zip(at_tp, at_base))
        return np.where(pick, at_tp, at_base)

    return each


def _fp8_copies(model: ModelSpec, cluster: ClusterSpec, P: PlanColumns, S: StageShapes, e: int) -> np.ndarray:
    """simulator.cost.precision.fp8_copies_bytes of each plan's stages (0 for a plan without fp8
    linear layers or parameters: a batch of none skips it)."""
    fp8_layer = P.per_plan(
        ("t", "prec", "fp8ag"),
        lambda q, i: fp8_layer_bytes(q, params.layer_params_per_rank(model, q.t), e),
        memo((model, cluster.gpu), "fp8 layer"),
    )
    return fp8_copies_bytes(
        column(fp8_layer), S.layers, column(P.zero), column(P.fp8ag), S.layer_params_each, e, column(P.shard_group)
    )


def step_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    terms: StageTerms,
    global_batch: int,
    runtime: Runtime,
    psi_local: np.ndarray,
) -> np.ndarray:
    """The analytic step time of the plans of ``terms`` (``psi_local``: the parameters whose
    optimizer state each plan's busiest rank steps)."""
    P, S, busy, p2p = terms.plans, terms.S, terms.busy, terms.p2p
    links = BatchLinks(cluster, P, runtime.scatter_gather)
    gpu, node = cluster.gpu, cluster.node
    e, sigma = dtype_bytes(gpu), gpu.comm_overlap_slowdown
    job_of = lambda q: Job(model, cluster, q, global_batch, runtime)
    offloaded, nvme = ~P.is_("offload", "none"), P.is_("offload", "nvme")
    dp = dp_columns(P, runtime)
    valid, rows = S.valid, np.arange(len(P.plans))
    # ---- per microbatch of each stage (simulator.analytic.pipeline_phase)
    sharded = sharded_exposed(model, S, dp, links, runtime, cluster, None if busy is None else column(busy))
    sharded = sharded + zero_infinity_exposed(node, S, dp, column(offloaded), column(nvme), runtime)
    per_mb = np.where(valid, stage_microbatch(S.total, terms.casts, terms.sends, p2p, sharded), -np.inf)
    crit = per_mb.argmax(axis=1)
    worst = per_mb[rows, crit]
    total = (np.where(valid, per_mb, 0.0) * S.count).sum(axis=1)
    kind = schedule_kind(P)
    saved = skipped_recompute(kind, S.recompute[rows, crit])
    fill = weight_fill(column(kind.zbv), S.backward_weight, S.forward_span)
    total_fill = (np.where(valid, fill, 0.0) * S.count).sum(axis=1)
    pipe = steady_seconds(P.m, worst, saved) + pipeline_bubble(worst, total, kind, P.v, fill[rows, crit], total_fill)

    # ---- data-parallel exposure of ZeRO 0-2 (simulator.analytic.dp_exposure)
    times = dp_step_times(S, dp, links, e, runtime, column(memory.bucket_bytes_of(runtime, P.d)))
    behind = S.dev * (S.backward_span + p2p)
    exposed = dp_exposed(times, S.backward_span, behind, runtime.dp_overlap, sigma)
    dp_exposed_s = np.maximum(0.0, stage_max(np.where(valid, exposed, 0.0)))
    gather_after = stage_max(np.where(valid, times.gather, 0.0))

    # ---- step end (simulator.analytic.step_end)
    tensors = optimizer_tensors(model, stage_max(np.where(valid, S.layers, 0)))
    optimizer = optimizer_seconds(cluster, psi_local, tensors, dtensor_params(P.t, P.d, P.zero, runtime))
    offload = offload_time(node, psi_local, offloaded, P.zero, nvme, runtime, P.m, dp.deferred[:, 0])
    opt, off = step_end_seconds(offloaded, optimizer, offload)
    tied = P.per_plan(("t", "p", "d"), lambda q, i: tied_embedding_time(job_of(q)), memo((model, cluster), "tied"))
    sync = P.per_plan(("t", "p", "d"), lambda q, i: step_sync_time(job_of(q)), memo((cluster,), "sync"))
    step = step_seconds(pipe, dp_step_exposed(dp_exposed_s, tied, sync), gather_after, opt, off)
    return step
