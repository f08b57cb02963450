"""Closed-form step time and memory of a plan: the planner's fast path (docs/design.md section 4.2).

Step time = pipeline time + exposed data-parallel time + optimizer + offload, where

* per microbatch a pipeline device spends c_i = forward + backward + recompute + TP
  collectives + exposed point-to-point (+ exposed ZeRO-3 gathers) (simulator.cost.stage);
* the pipeline runs m microbatches through the devices (:mod:`.pipeline`: T_pipe);
* the data-parallel reductions expose what the backward cannot hide (:mod:`.data_parallel`);
* every step all-reduces two scalars (the gradient norm over all ranks, the loss over the
  data-parallel group), latency-bound, and with p > 1 and tied embeddings the first and last
  stages all-reduce the word-embedding gradient (simulator.cost.step);
* the optimizer steps the rank's shard (simulator.cost.step.optimizer_time), or offload runs
  it on the host (:mod:`.offload`).
Memory is the one stage-memory model (simulator.cost.stage_memory) of each distinct stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simulator.analytic.data_parallel import DpLinks, DpPlan, dp_exposed, dp_links, dp_step_times, sharded_exposed
from simulator.analytic.offload import offload_time, zero_infinity_exposed
from simulator.analytic.pipeline import (
    ScheduleKind,
    p2p_exposed,
    p2p_sends,
    pipeline_bubble,
    skipped_recompute,
    stage_microbatch,
    steady_seconds,
    tied_embedding_time,
    weight_fill,
)
from simulator.cost.block_times import busy_ranks
from simulator.cost.cache import IdentityCache
from simulator.cost.fsdp2_sync import plan_deferred_sync
from simulator.cost.memory import bucket_bytes_of
from simulator.cost.ops import dtype_bytes
from simulator.cost.precision import FP8, weight_cast_seconds
from simulator.cost.rank_view import rank_job
from simulator.cost.stage import StageCost, stage_groups
from simulator.cost.stage_memory import StageMemory, stage_memory
from simulator.cost.step import (
    dp_step_exposed,
    host_fits,
    host_state_bytes,
    local_params,
    optimizer_tensors,
    optimizer_time,
    step_end_seconds,
    step_seconds,
    step_sync_time,
)
from simulator.cost.workload import executed_flops_per_iteration
from simulator.job import Job
from simulator.result import SimResult
from simulator.specs import ModelSpec

__all__ = ["estimate", "memory_only"]

Groups = list[tuple[int, StageCost, int]]  # (first device, cost, devices) of each distinct stage

_FLOPS = IdentityCache(4096)


@dataclass(frozen=True)
class PipelinePhase:
    """The pipelined passes of one step, seen from the critical (slowest) device."""

    m: int  # microbatches
    per_mb: list[float]  # each distinct stage's time per microbatch
    z3_exposed: list[float]  # of which exposed ZeRO-3 gathers and scatters (and offloaded fetches)
    sends: list[int]  # blocking pipeline sends per microbatch
    crit: int  # index (into the groups) of the critical stage
    saved: float  # recomputation GPipe skips for the last microbatch
    bubble: float  # the critical stage's idle time (pipeline.pipeline_bubble)

    @property
    def steady(self) -> float:
        """The critical stage's own work."""
        return steady_seconds(self.m, self.per_mb[self.crit], self.saved)

    @property
    def time(self) -> float:
        """T_pipe: the critical stage's work and its bubble."""
        return self.steady + self.bubble


def _per_sequence_flops(model: ModelSpec, full: int, sel: int) -> float:
    """Executed FLOPs per sequence (both are linear in the batch, workload.executed_flops_per_iteration)."""
    return _FLOPS.get_or_make((model,), (full, sel), lambda: executed_flops_per_iteration(model, 1, full, sel))


def pipeline_phase(job: Job, groups: Groups, links: DpLinks | None, p2p: float, busy: float | None) -> PipelinePhase:
    """Per-microbatch time of each stage (:func:`stage_microbatch`) and T_pipe. GPipe does not
    recompute the last microbatch: its activations are still resident when its backward runs.
    ``busy``: the ranks computing at once on a CPU node (simulator.cost.block_times.busy_ranks)."""
    plan, m = job.plan, job.m
    kind = ScheduleKind.of(plan.schedule, plan.v, m)
    dp = DpPlan.of(plan, job.runtime, job.m)
    offloaded = plan.offload != "none"
    per_mb, z3, sends = [], [], []
    for _, c, _ in groups:
        sharded = sharded_exposed(job.model, c, dp, links, job.runtime, job.cluster, busy) if links else 0.0
        sharded += zero_infinity_exposed(job.cluster.node, c, dp, offloaded, plan.offload == "nvme", job.runtime)
        n_send = p2p_sends(plan.p, plan.v, c.first, c.last, c.turn)
        per_mb.append(stage_microbatch(c.total, weight_casts(job, c), n_send, p2p, sharded))
        z3.append(sharded)
        sends.append(n_send)
    crit = max(range(len(per_mb)), key=per_mb.__getitem__)
    total = sum(x * g[2] for x, g in zip(per_mb, groups))
    saved = skipped_recompute(kind, groups[crit][1].recompute)
    fills = [weight_fill(kind.zbv, g[1].backward_weight, g[1].forward_span) for g in groups]
    total_fill = sum(f * g[2] for f, g in zip(fills, groups))
    bubble = pipeline_bubble(per_mb[crit], total, kind, plan.v, fills[crit], total_fill)
    return PipelinePhase(m, per_mb, z3, sends, crit, saved, bubble)


def weight_casts(job: Job, c: StageCost) -> float:
    """The fp8 weight casts a stage's microbatch adds (simulator.cost.precision.weight_cast_seconds)."""
    plan = job.plan
    return weight_cast_seconds(job.runtime.fp8_weight_cache, plan.prec == FP8, plan.fp8ag, c.weight_cast)


def dp_exposure(job: Job, groups: Groups, links: DpLinks | None, p2p: float) -> tuple[float, float]:
    """(exposed gradient reduction, parameter all-gather after the step) of ZeRO 0-2: the worst
    stage's (simulator.analytic.data_parallel.dp_exposed), each stage hiding its backward span
    (with overlap; its in-pass collectives included, StageCost.backward_span) and its head start
    over stage 0."""
    plan = job.plan
    if links is None:  # d = 1
        return 0.0, 0.0
    e = dtype_bytes(job.cluster.gpu)
    dp = DpPlan.of(plan, job.runtime, job.m)
    sigma = job.cluster.gpu.comm_overlap_slowdown
    exposed, gather_after = 0.0, 0.0
    for i, c, _ in groups:
        times = dp_step_times(c, dp, links, e, job.runtime, bucket_bytes_of(job.runtime, plan.d))
        behind = i * (c.backward_span + p2p)  # stage i's head start over stage 0
        exposed = max(exposed, dp_exposed(times, c.backward_span, behind, job.runtime.dp_overlap, sigma))
        gather_after = max(gather_after, times.gather)
    return max(0.0, exposed), gather_after


def step_end(job: Job, groups: Groups) -> tuple[float, float, float]:
    """(optimizer seconds, offload seconds, parameters of the busiest rank's shard)."""
    plan = job.plan
    psi = max(c.params for _, c, _ in groups)
    psi_local = local_params(psi, plan.zero, plan.shard_group, max(c.sharded_params for _, c, _ in groups))
    offloaded, nvme = plan.offload != "none", plan.offload == "nvme"
    optimizer = optimizer_time(job, psi_local, optimizer_tensors(job.model, max(c.layers for _, c, _ in groups)))
    deferred = plan_deferred_sync(plan, job.runtime)
    offload = offload_time(job.cluster.node, psi_local, offloaded, plan.zero, nvme, job.runtime, job.m, deferred)
    opt, off = step_end_seconds(offloaded, optimizer, offload)
    return opt, off, psi_local


def estimate(job: Job) -> SimResult:
    """The analytic prediction of one iteration (see the module docstring); a context- or
    expert-parallel plan priced as one rank sees it (simulator.cost.rank_view.rank_job), reported as given."""
    view = rank_job(job)
    return _estimate(job) if view is job else dataclasses.replace(_estimate(view), job=job)


def _estimate(job: Job) -> SimResult:
    model, cluster, plan = job.model, job.cluster, job.plan
    busy = busy_ranks(cluster, plan, job.m)
    groups = _stage_groups(job, busy)
    p2p = p2p_exposed(job)
    links = dp_links(cluster, plan, job.runtime.scatter_gather) if plan.d > 1 else None
    pipe = pipeline_phase(job, groups, links, p2p, busy)
    dp_exposed, gather_after = dp_exposure(job, groups, links, p2p)
    opt, off, psi_local = step_end(job, groups)
    dp_exposed = dp_step_exposed(dp_exposed, tied_embedding_time(job), step_sync_time(job))
    step = step_seconds(pipe.time, dp_exposed, gather_after, opt, off)

    m, crit, c = job.m, pipe.crit, groups[pipe.crit][1]
    breakdown = {
        "compute": m * (c.forward + c.backward + weight_casts(job, c)),
        "recompute": m * c.recompute - pipe.saved,
        "tp_comm": m * c.tp_comm,
        "cp_comm": m * c.cp_comm,
        "ep_comm": m * c.ep_comm,
        "pp_comm": m * pipe.sends[crit] * p2p,
        "dp_comm": m * pipe.z3_exposed[crit] + dp_exposed + gather_after,
        "bubble": pipe.bubble,
        "offload": off,
        "optimizer": opt,
    }
    peak_stage, pm = max(_stage_memories(job, groups), key=lambda x: x[1].total)
    full = sum(g.full_layers * n for _, g, n in groups)
    sel = sum(g.selective_layers * n for _, g, n in groups)
    extra: dict[str, float] = {"peak_memory_stage": peak_stage, "critical_stage": groups[crit][0]}
    fits_host = True
    if plan.offload != "none":
        host = host_state_bytes(cluster.gpus_per_node, psi_local, plan.zero)
        extra["host_memory_gib"] = host / 2**30
        fits_host = bool(host_fits(cluster.node, host, True, plan.offload == "nvme"))
    return SimResult(
        job=job,
        step_time=step,
        peak_memory=pm.total,
        memory_capacity=cluster.gpu.usable_memory_bytes,
        time_breakdown=breakdown,
        memory_breakdown={
            "params": pm.params,
            "grads": pm.grads,
            "optimizer": pm.optimizer,
            "activations": pm.activations,
            "buffers": pm.buffers,
        },
        executed_flops=_per_sequence_flops(model, full, sel) * job.global_batch,
        model_flops=_per_sequence_flops(model, 0, 0) * job.global_batch,
        bubble_fraction=pipe.bubble / pipe.steady if pipe.steady > 0 else 0.0,
        fidelity="analytic",
        extra=extra,
        host_fits=fits_host,
    )


def _stage_memories(job: Job, groups: Groups) -> list[tuple[int, StageMemory]]:
    """(device, memory) of the first device of each distinct stage: in-flight microbatches
    never grow with the device index, so that device is the peak of its kind."""
    return [
        (
            i,
            stage_memory(job.model, job.cluster, job.plan, job.m, i, c, job.runtime),
        )
        for i, c, _ in groups
    ]


def memory_only(job: Job) -> float:
    """Peak bytes of the plan's most loaded rank (the planner prunes with this first)."""
    job = rank_job(job)
    groups = _stage_groups(job, busy_ranks(job.cluster, job.plan, job.m))  # the estimate's (cached) stages
    return max(mem.total for _, mem in _stage_memories(job, groups))


def _stage_groups(job: Job, busy: float | None) -> Groups:
    """The distinct stages of ``job`` as its runtime runs them (simulator.cost.stage.stage_groups),
    ``busy`` ranks computing at once on a CPU node."""
    rt = job.runtime
    return stage_groups(
        job.model, job.cluster, job.plan, rt.layer_kernels, rt.attention_kernel, busy, rt.loss(job.plan.t)
    )
