"""Closed forms of data-parallel traffic: what each stage's reduction exposes.

DP gradient reduction (all-reduce; reduce-scatter for ZeRO-1/2: simulator.cost.step.
gradient_all_reduced) is bucketed and overlaps the last microbatch's backward on its stage,
except its last bucket (DDP's 25 MB buckets fill in backward order; the last one, the
remainder, is reduced after the backward ends):
    exposed = max(reduce - slack, reduce(last bucket));
stage i finishes i backward steps before stage 0, which hides that much more; ZeRO-1/2 then
all-gather the updated parameters. Without bucketing (``job.runtime.dp_overlap`` False:
Megatron-LM's "local" DDP of 2021, or Megatron-DeepSpeed with gradient bucketing off) the whole
reduction starts after the stage's last backward and only the i backward steps of slack remain.
ZeRO-2 and ZeRO-3 keep only a gradient shard, so they reduce-scatter every microbatch's
gradients under its backward; ZeRO-3 also gathers each unit's parameters in forward and again
in backward, prefetched under the compute of that pass (simulator.cost.zero3). Whatever
overlaps compute slows it (simulator.cost.overlap).

Each rule takes numbers (one plan's stage, from the scalar estimate) or arrays (many plans'
stages, from the batch estimate) alike, and prices its collectives through a
:class:`DpCollectives`: :class:`DpLinks` for one plan, the batch estimate's figures for many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, fsdp2_sync, fsdp2_window, memory, state_bytes, zero3
from simulator.cost.block_times import synchronous_op_seconds
from simulator.cost.cache import IdentityCache
from simulator.cost.ops import dtype_bytes
from simulator.cost.overlap import overlap_cost
from simulator.cost.precision import gathered_bytes
from simulator.cost.stage_memory import StageLike
from simulator.cost.state_bytes import grad_reduce_bytes, step_gather_bytes
from simulator.cost.step import gradient_all_reduced, rank_tensors, reduction_op
from simulator.numeric import any_of, fmod, maximum, minimum, negate, where
from simulator.plan import Plan
from simulator.runtime_spec import Runtime, ScatterGather
from simulator.specs import ModelSpec

_DP_LINKS = IdentityCache(4096)


class DpCollectives(zero3.ShardedCollectives, Protocol):
    """The data-parallel collectives a plan's stage issues: its gradient reduction over all d
    ranks (ZeRO 0-2) and the shard group's gathers and reductions (zero3.ShardedCollectives)."""

    def reduce_gradients(self, all_reduced: Any, size_bytes: Any) -> Any: ...


class DpPlan(NamedTuple):
    """What the data-parallel rules read of a plan: numbers for one plan, arrays for many."""

    zero: Any
    d: Any
    fp8ag: Any
    fsdp2: Any  # FSDP2 shards the parameters (simulator.cost.fsdp2_sync.fsdp2_sharded)
    m: Any = 1  # microbatches per step
    deferred: Any = False  # FSDP2's gradient sync deferred to the step's end (simulator.cost.fsdp2_sync.deferred_sync)
    step_gathers: Any = 0.0  # with it, each unit's gathers per step (simulator.cost.fsdp2_window.step_gathers)

    @staticmethod
    def of(plan: Plan, runtime: Runtime, m: int) -> DpPlan:
        fsdp2 = fsdp2_sync.fsdp2_sharded(plan, runtime)
        deferred = fsdp2_sync.plan_deferred_sync(plan, runtime)
        gathers = fsdp2_window.step_gathers(plan.schedule, plan.p, m, plan.v, plan.zero) if deferred else 0.0
        return DpPlan(plan.zero, plan.d, plan.fp8ag, fsdp2, m, deferred, gathers)


@dataclass(frozen=True)
class DpLinks:
    """:class:`DpCollectives` of one plan on its cluster."""

    d: int
    dp: collectives.GroupLink
    shards: zero3.ShardLinks

    def reduce_gradients(self, all_reduced: bool, size_bytes: float) -> float:
        """An all-reduce (``all_reduced``: simulator.cost.step.gradient_all_reduced) or a
        reduce-scatter of ``size_bytes`` over the d ranks."""
        return collectives.collective_time(reduction_op(all_reduced), size_bytes, self.d, self.dp)

    @property
    def n(self) -> int:
        return self.shards.n

    def all_gather(self, size_bytes: float) -> float:
        return self.shards.all_gather(size_bytes)

    def reduce_scatter(self, size_bytes: float) -> float:
        return self.shards.reduce_scatter(size_bytes)

    def replica_all_reduce(self, size_bytes: float) -> float:
        return self.shards.replica_all_reduce(size_bytes)


def dp_links(cluster: ClusterSpec, plan: Plan, scatter_gather: ScatterGather) -> DpLinks:
    """The plan's data-parallel group and shard groups (simulator.cost.zero3.shard_links), the
    shard group's collectives as the runtime runs them (``scatter_gather``: Runtime.scatter_gather);
    cached per cluster and (t, d, hsdp, scatter_gather)."""
    return _DP_LINKS.get_or_make(
        (cluster,),
        (plan.t, plan.d, plan.hsdp, scatter_gather),
        lambda: DpLinks(
            plan.d, collectives.dp_link(cluster, plan.t, plan.d), zero3.shard_links(cluster, plan, scatter_gather)
        ),
    )


def stage_gathered_bytes(cost: StageLike, fp8ag: Any, per_param: int) -> Any:
    """Bytes of all-gathering one rank's parameters of stage ``cost``: ``per_param`` bytes per
    parameter (simulator.cost.state_bytes.param_gather_bytes, step_gather_bytes), its layers' at 1 byte
    with fp8 parameters (simulator.cost.precision.gathered_bytes)."""
    return gathered_bytes(cost.params, cost.layer_params, per_param, fp8ag)


def sharded_exposed(
    model: ModelSpec,
    cost: StageLike,
    plan: DpPlan,
    links: DpCollectives,
    runtime: Runtime,
    cluster: ClusterSpec,
    busy: Any = None,
) -> Any:
    """Exposed seconds per microbatch of the ZeRO stages that keep only a gradient shard and so
    must reduce-scatter every microbatch's gradients (ZeRO-2, ZeRO-3; DeepSpeed and FSDP both
    do; FSDP2 under a pipeline once a step, :func:`dp_step_times`), over d > 1 ranks. They hide behind the stage's pass spans, its in-pass collectives included
    (StageCost.forward_span, backward_span), at the contention price of simulator.cost.overlap.

    * bucketed ZeRO-2 (DeepSpeed, Megatron's distributed optimizer): a reduce-scatter of the
      stage's gradients, under the backward when the runtime overlaps;
    * ZeRO-3, and FSDP2's ZeRO-2: each unit's gathers, re-gathers and scatters
      (simulator.cost.zero3.zero3_pass), FSDP2's hooks on a synchronous (CPU) rank at the
      slowdown of the ``busy`` ranks computing at once (simulator.cost.block_times.busy_ranks)."""
    zero, d, fp8ag, fsdp2, m, deferred, step_gathers = plan
    gpu = cluster.gpu
    e, sigma = dtype_bytes(gpu), gpu.comm_overlap_slowdown
    active = (d > 1) & (zero >= 2)
    bucketed = active & (zero == 2) & negate(fsdp2)
    sharded = active & negate(bucketed)
    out = 0.0
    if any_of(bucketed):
        scatter = zero3.sharded_reduce_time(cost.params * fsdp2_sync.reduce_bytes(runtime, e), links)
        out = where(bucketed, overlap_cost(cost.backward_span, scatter, sigma) if runtime.dp_overlap else scatter, out)
    if any_of(sharded):
        gathered = stage_gathered_bytes(cost, fp8ag, state_bytes.param_gather_bytes(e))
        host_op_s = synchronous_op_seconds(cluster, busy)
        tensors = rank_tensors(model, cost.layers, cost.first, cost.last) if host_op_s is not None else 0
        z3 = zero3.zero3_pass(
            cost, links, e, gathered, runtime, gpu, zero, host_op_s, tensors, m, deferred, step_gathers
        )
        out = where(sharded, z3.exposed(cost.forward_span, cost.backward_span, sigma), out)
    return out


def last_bucket_bytes(grad_bytes: Any, bucket_bytes: Any = memory.DP_BUCKET_BYTES) -> Any:
    """Bytes of the last gradient bucket to fill: the remainder of whole buckets, in (0, bucket].
    Numbers or arrays alike."""
    rest = fmod(grad_bytes, bucket_bytes)
    return where(grad_bytes <= bucket_bytes, grad_bytes, where(rest > 0, rest, bucket_bytes))


@dataclass(frozen=True)
class DpStepTimes:
    """A stage's data-parallel traffic outside the microbatches, seconds (numbers or arrays): the
    gradient reduction after the last backward, its last bucket's, and the parameter all-gather
    after the optimizer step; ``after_backward``: the reduction starts once the last backward
    is done, hidden by none of it (FSDP2's deferred sync, simulator.cost.fsdp2_sync.deferred_sync)."""

    reduce: Any
    last_bucket: Any
    gather: Any
    after_backward: Any = False


def dp_step_times(
    cost: StageLike,
    plan: DpPlan,
    links: DpCollectives,
    e: int,
    runtime: Runtime,
    bucket_bytes: Any = memory.DP_BUCKET_BYTES,
) -> DpStepTimes:
    """:class:`DpStepTimes` of stage ``cost`` for ZeRO 0-2 over d > 1 ranks; 0 for ZeRO-3 and
    FSDP2's ZeRO-2, whose traffic is per microbatch (:func:`sharded_exposed`), but for their
    reduce-scatters where FSDP2 defers them to the step's end (simulator.cost.fsdp2_sync.
    deferred_sync): the stage's units one after the other once its last backward is done, the
    last unit's the last bucket. ZeRO-0 all-reduces and ZeRO-1 reduce-scatters the gradients at
    the end; ZeRO-2 has reduced them per microbatch; ZeRO-1/2 all-gather the updated parameters
    inside the shard group. The last bucket's reduction (buckets of ``bucket_bytes``: the
    runtime's, simulator.cost.memory.bucket_bytes_of) is the whole one when the gradients fit in
    one bucket. The gradients move at the program's gradient bytes, the gathered parameters at
    its parameter bytes (simulator.cost.state_bytes.grad_reduce_bytes, step_gather_bytes), each
    collective as the runtime runs it (Runtime.scatter_gather: simulator.cost.step.sharded_op)."""
    zero, d, fp8ag, fsdp2, _, deferred, _ = plan
    deferred = deferred & (d > 1)
    active = (d > 1) & (zero < 3) & negate(fsdp2)
    reduce, last_reduce, gather = 0.0, 0.0, 0.0
    if any_of(active):
        grad_bytes = cost.params * grad_reduce_bytes(e, runtime.states)
        all_reduced = gradient_all_reduced(zero, runtime.scatter_gather)
        at_end = active & (zero <= 1)  # ZeRO-2 has reduced its gradients per microbatch
        reduce = where(at_end, links.reduce_gradients(all_reduced, grad_bytes), 0.0) if any_of(at_end) else 0.0
        last = last_bucket_bytes(grad_bytes, bucket_bytes)
        partial = at_end & (last < grad_bytes)  # gradients in more than one bucket
        last_reduce = where(partial, links.reduce_gradients(all_reduced, last), reduce) if any_of(partial) else reduce
        gathers = active & (zero >= 1)
        if any_of(gathers):
            size = stage_gathered_bytes(cost, fp8ag, step_gather_bytes(e, runtime.states))
            gather = where(gathers, links.all_gather(size), 0.0)
    if any_of(deferred):
        scatter = zero3.stage_scatter(cost, links, runtime, e)
        reduce = where(deferred, scatter, reduce)
        last_reduce = where(deferred, scatter / zero3.units(cost.layers, cost.first, cost.last), last_reduce)
    return DpStepTimes(reduce, last_reduce, gather, deferred)


def dp_exposed(times: DpStepTimes, backward: Any, behind: Any, dp_overlap: bool, sigma: float) -> Any:
    """What a stage's end-of-step gradient reduction exposes (module docstring): the reduction
    beyond what its last backward (``backward``, with overlap) and its head start over stage 0
    (``behind``) hide, at least its last bucket's beyond the head start, and at least the
    contention it adds beside the last backward (simulator.cost.overlap)."""
    hidden = where(times.after_backward, 0.0, backward if dp_overlap else 0.0)
    contention = sigma * minimum(times.reduce, hidden)
    return maximum(maximum(times.reduce - hidden - behind, times.last_bucket - behind), contention)
