"""Closed forms of data-parallel traffic: what each stage's reduction exposes.

DP gradient reduction (all-reduce; reduce-scatter for ZeRO-1/2: simulator.cost.step.
gradient_reduction) is bucketed and overlaps the last microbatch's backward on its stage,
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
"""

from __future__ import annotations

import math

from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, layout, memory, zero3
from simulator.cost.ops import dtype_bytes
from simulator.cost.overlap import overlap_cost
from simulator.cost.precision import gathered_bytes
from simulator.cost.stage import StageCost, compute_slowdown, host_async
from simulator.cost.step import gradient_reduction, optimizer_tensors, param_gather_bytes
from simulator.cost.workload import layer_param_tensors
from simulator.job import OVERLAPPED, Job, Runtime
from simulator.plan import Plan
from simulator.specs import ModelSpec


def stage_gathered_bytes(cost: StageCost, plan: Plan, e: int) -> float:
    """Bytes of all-gathering one rank's parameters of stage ``cost``: param_gather_bytes(e) per
    parameter, its layers' at 1 byte with fp8 parameters (simulator.cost.precision.gathered_bytes)."""
    return gathered_bytes(cost.params, cost.layer_params, param_gather_bytes(e), plan.fp8ag)


def stage_tensors(model: ModelSpec, cost: StageCost) -> int:
    """Parameter tensors of one rank of stage ``cost``: its layers' and, on a stage holding the
    embedding or the head, the non-layer ones (simulator.cost.step.optimizer_tensors)."""
    return (
        optimizer_tensors(model, cost.layers) if cost.first or cost.last else cost.layers * layer_param_tensors(model)
    )


def dp_link(cluster: ClusterSpec, plan: Plan) -> collectives.GroupLink:
    """The link of the plan's data-parallel groups."""
    return collectives.group_link(cluster, layout.dp_shape(plan.t, plan.d, cluster.gpus_per_node))


def per_microbatch_dp(cost: StageCost, job: Job, link: collectives.GroupLink) -> tuple[float, float]:
    """(communication time, exposed time) per microbatch of the ZeRO stages that keep only a
    gradient shard and so must reduce-scatter every microbatch's gradients (ZeRO-2, ZeRO-3;
    DeepSpeed and FSDP both do), overlapped with that microbatch's backward when the runtime
    overlaps, at the contention price of simulator.cost.overlap. ZeRO-3 also all-gathers each
    unit's parameters for the forward and again for the backward (simulator.cost.zero3). Both
    hide behind the passes' spans, their in-pass collectives included (StageCost.forward_span)."""
    plan, gpu = job.plan, job.cluster.gpu
    if plan.zero < 2 or plan.d == 1:
        return 0.0, 0.0
    e = dtype_bytes(gpu)
    sigma = gpu.comm_overlap_slowdown
    bwd = cost.backward_span
    links = zero3.shard_links(job.cluster, plan) if plan.hsdp else zero3.ShardLinks(link, plan.d, None, 1)
    if not zero3.fsdp2_sharded(plan, job.runtime) and plan.zero == 2:
        scatter = zero3.sharded_reduce_time(cost.params * zero3.reduce_bytes(job.runtime, e), links)
        return scatter, overlap_cost(bwd, scatter, sigma) if job.runtime.dp_overlap else scatter
    z3 = zero3.zero3_pass(
        cost,
        links,
        e,
        stage_gathered_bytes(cost, plan, e),
        job.runtime,
        gpu,
        plan.zero,
        None if host_async(job.cluster) else gpu.kernel_launch_us * 1e-6 * compute_slowdown(job.cluster),
        stage_tensors(job.model, cost),
    )
    return z3.traffic, z3.exposed(cost.forward_span, bwd, sigma)


def last_bucket_bytes(grad_bytes: float, bucket_bytes: float = memory.DP_BUCKET_BYTES) -> float:
    """Bytes of the last gradient bucket to fill: the remainder of whole buckets, in (0, bucket]."""
    if grad_bytes <= bucket_bytes:
        return grad_bytes
    rest = math.fmod(grad_bytes, bucket_bytes)
    return rest if rest > 0 else bucket_bytes


def last_bucket_reduce_time(cost: StageCost, plan: Plan, link: collectives.GroupLink, e: int, whole: float) -> float:
    """Reduction of the stage's last gradient bucket (all-reduce; reduce-scatter with ZeRO-1);
    ``whole``: the reduction of all its gradients (:func:`dp_times`), which it is when they fit
    in one bucket."""
    if plan.d == 1 or plan.zero >= 2:
        return 0.0
    grad_bytes = cost.params * e
    last = last_bucket_bytes(grad_bytes)
    if last >= grad_bytes:
        return whole
    return collectives.collective_time(gradient_reduction(plan.zero), last, plan.d, link)


def dp_times(
    cost: StageCost,
    cluster: ClusterSpec,
    plan: Plan,
    link: collectives.GroupLink,
    e: int,
    runtime: Runtime = OVERLAPPED,
) -> tuple[float, float]:
    """(gradient reduction at the end of the step, parameter all-gather after the optimizer
    step) for ZeRO 0-2, seconds; ZeRO-2 reduces per microbatch (:func:`per_microbatch_dp`), and
    with hybrid sharding gathers inside its shard group; FSDP2's ZeRO-2 (``runtime.zero2``)
    gathers before each forward instead (:func:`per_microbatch_dp`): nothing after the step."""
    if plan.d == 1 or plan.zero == 3 or zero3.fsdp2_sharded(plan, runtime):
        return 0.0, 0.0
    reduce = collectives.collective_time(gradient_reduction(plan.zero), cost.params * e, plan.d, link)
    if plan.zero == 0:
        return reduce, 0.0
    if plan.hsdp:
        link = zero3.shard_links(cluster, plan).shard
    gather = collectives.all_gather_time(stage_gathered_bytes(cost, plan, e), plan.shard_group, link)
    return (reduce if plan.zero == 1 else 0.0), gather
