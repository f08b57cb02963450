"""Closed-form step time and memory of a plan: the planner's fast path.

Step time = pipeline time + exposed data-parallel time + optimizer + offload, where

* per microbatch a pipeline device spends c_i = forward + backward + recompute + TP
  collectives + exposed point-to-point (+ exposed ZeRO-3 gathers);
* GPipe / 1F1B:  T_pipe = (m - 1) * max_i c_i + sum_i c_i
  interleaved:   T_pipe = m * max_i c_i + (sum_i c_i - max_i c_i) / v
  which for equal stages gives a bubble of (p - 1)/m (resp. (p - 1)/(v m)) of the ideal
  m * c (Narayanan et al. 2021, section 2.2);
* DP gradient reduction (all-reduce; reduce-scatter for ZeRO-1/2) is bucketed and overlaps
  the last microbatch's backward on its stage, except its last bucket (DDP's 25 MB buckets
  fill in backward order; the last one, the remainder, is reduced after the backward ends):
  exposed = max(reduce - slack, reduce(last bucket)); stage i finishes i backward steps before
  stage 0, which hides that much more; ZeRO-1/2 then all-gather the updated parameters.
  Without bucketing (``job.runtime.dp_overlap`` False: Megatron-LM's "local" DDP of 2021, or
  Megatron-DeepSpeed with gradient bucketing off) the whole reduction starts after the
  stage's last backward and only the i backward steps of slack remain;
* every step all-reduces two scalars (the gradient norm over all ranks, the loss over the
  data-parallel group), latency-bound (``step_sync_time``);
* with p > 1 and tied embeddings the first and last stages all-reduce the word-embedding
  gradient (V/t x h, e bytes) between them before the step (Megatron-LM
  ``_allreduce_embedding_grads``; DeepSpeed pipeline ``_exec_reduce_tied_grads``);
* ZeRO-2 and ZeRO-3 keep only a gradient shard, so they reduce-scatter every microbatch's
  gradients under its backward; ZeRO-3 also gathers parameters in forward and again in
  backward (1.5x the all-reduce volume at m = 1), prefetched under the compute of that pass;
* the optimizer step of the rank's shard (simulator.cost.step.optimizer_time: the mixed-
  precision step's HBM streaming, or the calibrated eager optimizer);
* offload (ZeRO-Offload / ZeRO-Infinity): gradient shards down and parameter shards up
  over each GPU's PCIe link, Adam on the host CPU (all of a node's ranks share it),
  NVMe reads and writes the optimizer state.
"""

from __future__ import annotations

import math

from hwprofiles.algorithms import uses_trees
from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, layout, memory
from simulator.cost.cache import IdentityCache
from simulator.cost.ops import dtype_bytes
from simulator.cost.stage import StageCost, block_times, stage_groups
from simulator.cost.stage_memory import StageMemory, stage_memory
from simulator.cost.step import (CPU_ADAM_STATE_BYTES, OFFLOAD_SUBGROUPS, gradient_reduction, host_fits,
                                 host_state_bytes, local_params, optimizer_time, optimizer_tensors, param_gather_bytes,
                                 pipeline_send, step_sync_time, tied_embedding_bytes)
from simulator.cost.workload import executed_flops_per_iteration
from simulator.result import SimResult
from simulator.specs import Job, ModelSpec, Plan


def p2p_sends(plan: Plan, first: bool, last: bool) -> int:
    """Blocking pipeline sends of one device per microbatch: each of its v chunks sends the
    forward activation on and the backward gradient back, except that the model's first
    chunk sends no gradient and its last chunk no activation."""
    return 0 if plan.p == 1 else 2 * plan.v - int(first) - int(last)


_FLOPS = IdentityCache(4096)
_P2P = IdentityCache(4096)
_TIED = IdentityCache(4096)


def _per_sequence_flops(model: ModelSpec, full: int, sel: int) -> float:
    """Executed FLOPs per sequence (both are linear in the batch, workload.executed_flops_per_iteration)."""
    return _FLOPS.get_or_make((model,), (full, sel), lambda: executed_flops_per_iteration(model, 1, full, sel))


def p2p_exposed(job: Job) -> float:
    """Seconds of one pipeline send (cached per model, cluster and layout; see _p2p_time)."""
    plan = job.plan
    return _P2P.get_or_make((job.model, job.cluster), (plan.t, plan.sp, plan.mb, plan.p, plan.d), lambda: _p2p_time(job))


def _pipeline_link(cluster: ClusterSpec, plan: Plan) -> tuple[float, float, bool]:
    """(bytes/s, latency, crosses nodes) of the link joining two pipeline stages: a GPU's share
    of its node's NICs when some stage boundary crosses nodes, else send/recv's figures inside
    the node."""
    node = cluster.node
    gpn = cluster.gpus_per_node
    if layout.pp_crosses_nodes(plan.t, plan.p, plan.d, gpn) and node.nic is not None and node.nics_per_node:
        return node.nic.bytes_per_s * min(1.0, node.nics_per_node / gpn), node.nic.latency_s, True
    return (*node.intra_figures("send_recv"), False)


def _p2p_time(job: Job) -> float:
    """Seconds of one pipeline send (b*s*h elements). With t > 1 across nodes each TP rank
    sends b*s*h/t over its own NIC and the receivers all-gather over NVLink (Megatron's
    scatter/gather optimization, Narayanan et al. 2021, section 4.1). Inside a node the
    receiver may wait for a busy core (collectives.in_pass_wait)."""
    plan, cluster = job.plan, job.cluster
    if plan.p == 1:
        return 0.0
    bt = block_times(job.model, cluster, plan.t, bool(plan.sp), plan.mb)
    bw, lat, crosses = _pipeline_link(cluster, plan)
    size, extra = pipeline_send(cluster, plan, bt.act_bytes, crosses)
    return collectives.p2p_time(size, bw, lat) + extra


def _dp_link(cluster: ClusterSpec, plan: Plan) -> collectives.GroupLink:
    """The link of the plan's data-parallel groups."""
    return collectives.group_link(cluster, layout.dp_shape(plan.t, plan.d, cluster.gpus_per_node))


def per_microbatch_dp(cost: StageCost, plan: Plan, link: collectives.GroupLink, e: int, overlap: bool) -> tuple[float, float]:
    """(communication time, exposed time) per microbatch of the ZeRO stages that keep only a
    gradient shard and so must reduce-scatter every microbatch's gradients (ZeRO-2, ZeRO-3;
    DeepSpeed and FSDP both do): overlapped with that microbatch's backward when the
    runtime overlaps. ZeRO-3 also all-gathers the stage's parameters for the forward and
    again for the backward, prefetched under that pass's compute."""
    if plan.zero < 2 or plan.d == 1:
        return 0.0, 0.0
    scatter = collectives.reducescatter_time(cost.params * e, plan.d, link)
    bwd = cost.backward + cost.recompute
    if plan.zero == 2:
        return scatter, max(0.0, scatter - bwd) if overlap else scatter
    gather = collectives.allgather_time(cost.params * param_gather_bytes(e), plan.d, link)
    exposed = max(0.0, gather - cost.forward) + max(0.0, gather + scatter - bwd)
    return 2 * gather + scatter, exposed


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


def dp_times(cost: StageCost, plan: Plan, link: collectives.GroupLink, e: int) -> tuple[float, float]:
    """(gradient reduction at the end of the step, parameter all-gather after the optimizer
    step) for ZeRO 0-2, seconds; ZeRO-2 reduces per microbatch (:func:`per_microbatch_dp`)."""
    if plan.d == 1 or plan.zero == 3:
        return 0.0, 0.0
    reduce = collectives.collective_time(gradient_reduction(plan.zero), cost.params * e, plan.d, link)
    if plan.zero == 0:
        return reduce, 0.0
    gather = collectives.allgather_time(cost.params * param_gather_bytes(e), plan.d, link)
    return (reduce if plan.zero == 1 else 0.0), gather


def offload_time(job: Job, psi_local: float) -> float:
    """Exposed offload seconds per step for ``psi_local`` parameters per rank (its 1/d shard).

    The reduced gradient shard goes down over the rank's PCIe link (2 bytes/param), then the
    step runs pipelined over k = OFFLOAD_SUBGROUPS sub-groups through the phases NVMe read +
    write of the optimizer state (nvme only; all of a node's ranks share its drives), host
    Adam (all of a node's ranks share the CPU) and the updated fp16 shard back up over PCIe
    (not with ZeRO-3, whose parameters stay on the host):
        T = down + sum(phases)/k + (k - 1)/k * max(phases)
    (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021)."""
    plan, node = job.plan, job.cluster.node
    if plan.offload == "none":
        return 0.0
    pcie = node.pcie.bytes_per_s
    down = psi_local * 2 / pcie + node.pcie.latency_s
    phases = [node.gpus_per_node * psi_local * CPU_ADAM_STATE_BYTES / (node.cpu_adam_GBps * 1e9)]
    if plan.zero < 3:
        phases.append(psi_local * 2 / pcie + node.pcie.latency_s)
    if plan.offload == "nvme" and node.nvme is not None:
        phases.append(2 * node.gpus_per_node * psi_local * memory.OPTIMIZER_BYTES_PER_PARAM
                      / (node.nvme.count * node.nvme.bandwidth_GBps * 1e9))
    k = OFFLOAD_SUBGROUPS
    return down + sum(phases) / k + (k - 1) / k * max(phases)


def offloaded_param_fetch(job: Job, cost: StageCost) -> float:
    """ZeRO-Infinity (zero=3 with offload): seconds to bring this rank's 1/d parameter shard
    of the stage up for one pass: over its PCIe link, and first from NVMe (shared by the
    node's ranks) with offload=nvme; prefetched layer by layer, so reads and copies overlap."""
    plan, node = job.plan, job.cluster.node
    shard = cost.params * 2 / plan.d
    t = shard / node.pcie.bytes_per_s
    if plan.offload == "nvme" and node.nvme is not None:
        t = max(t, shard * node.gpus_per_node / (node.nvme.count * node.nvme.bandwidth_GBps * 1e9))
    return t


def pipeline_time(worst: float, total: float, m: int, schedule: str, v: int) -> float:
    """``worst``: the slowest device's time per microbatch; ``total``: the sum over devices."""
    if schedule == "interleaved" and v > 1:
        return m * worst + (total - worst) / v
    return (m - 1) * worst + total


def tied_embedding_time(job: Job) -> float:
    """All-reduce of the word-embedding gradient (V/t x h, e bytes; V padded) between the first
    and the last pipeline stage when p > 1 and the embeddings are tied: a 2-rank all-reduce
    (S/B) over NVLink inside a node, else over the node's NICs shared by all its GPUs (every
    TP/DP rank of the two stages does it at once). Cached per (model, cluster, t, p, d)."""
    model, cluster, plan = job.model, job.cluster, job.plan
    if plan.p == 1 or not model.tie_embeddings:
        return 0.0
    return _TIED.get_or_make((model, cluster), (plan.t, plan.p, plan.d), lambda: _tied_allreduce(model, cluster, plan))


def _tied_allreduce(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> float:
    size = tied_embedding_bytes(model, plan.t, dtype_bytes(cluster.gpu))
    bw, lat, crosses = _pipeline_link(cluster, plan)
    link = collectives.GroupLink(bw, lat, uses_trees(cluster.node.backend)) if crosses else collectives.node_link(cluster)
    return collectives.allreduce_time(size, 2, link)


def estimate(job: Job) -> SimResult:
    """The analytic prediction of one iteration (see the module docstring)."""
    runtime = job.runtime
    model, cluster, plan = job.model, job.cluster, job.plan
    m = job.m
    gpu = cluster.gpu
    e = dtype_bytes(gpu)
    groups = stage_groups(model, cluster, plan)
    p2p = p2p_exposed(job)
    link = _dp_link(cluster, plan) if plan.d > 1 else None

    per_mb, z3_comm, sends = [], [], []
    for _, c, _ in groups:
        z3_exp = per_microbatch_dp(c, plan, link, e, runtime.dp_overlap)[1] if link else 0.0
        if plan.offload != "none" and plan.zero == 3:
            fetch = offloaded_param_fetch(job, c)
            z3_exp += max(0.0, fetch - c.forward) + max(0.0, fetch - c.backward - c.recompute)
        n_send = p2p_sends(plan, c.first, c.last)
        per_mb.append(c.total + n_send * p2p + z3_exp)
        z3_comm.append(z3_exp)
        sends.append(n_send)
    crit = max(range(len(per_mb)), key=per_mb.__getitem__)
    total = sum(x * g[2] for x, g in zip(per_mb, groups))
    # GPipe does not recompute the last microbatch: its activations are still resident
    saved = groups[crit][1].recompute if plan.schedule == "gpipe" and m > 1 else 0.0
    t_pipe = pipeline_time(per_mb[crit], total, m, plan.schedule, plan.v) - saved

    # data-parallel gradient reduction after each stage's last backward
    dp_exposed, gather_after = 0.0, 0.0
    if link is not None and plan.zero < 3:
        for i, c, _ in groups:
            reduce_t, gather_t = dp_times(c, plan, link, e)
            behind = i * (c.backward + c.recompute + p2p)  # stage i's head start over stage 0
            slack = (c.backward + c.recompute if runtime.dp_overlap else 0.0) + behind
            tail = last_bucket_reduce_time(c, plan, link, e, reduce_t) - behind
            dp_exposed = max(dp_exposed, reduce_t - slack, tail)
            gather_after = max(gather_after, gather_t)
        dp_exposed = max(0.0, dp_exposed)

    psi_max = max(c.params for _, c, _ in groups)
    psi_local = local_params(psi_max, plan)
    if plan.offload == "none":
        opt = optimizer_time(job, psi_local, optimizer_tensors(model, max(c.layers for _, c, _ in groups)))
        off = 0.0
    else:
        opt, off = 0.0, offload_time(job, psi_local)
    tied = tied_embedding_time(job)
    dp_exposed += tied + step_sync_time(job)
    step = t_pipe + dp_exposed + gather_after + opt + off

    c = groups[crit][1]
    steady = m * per_mb[crit] - saved  # the critical stage's own work: the rest is bubble
    breakdown = {
        "compute": m * (c.forward + c.backward),
        "recompute": m * c.recompute - saved,
        "tp_comm": m * c.tp_comm,
        "pp_comm": m * sends[crit] * p2p,
        "dp_comm": m * z3_comm[crit] + dp_exposed + gather_after,
        "bubble": t_pipe - steady,
        "offload": off,
        "optimizer": opt,
    }

    mems = _stage_memories(job, groups)
    peak_stage, pm = max(mems, key=lambda x: x[1].total)
    full = sum(g.full_layers * n for _, g, n in groups)
    sel = sum(g.selective_layers * n for _, g, n in groups)
    extra = {"peak_memory_stage": peak_stage, "critical_stage": groups[crit][0]}
    fits_host = True
    if plan.offload != "none":
        host = host_state_bytes(job, psi_local)
        extra["host_memory_gib"] = host / 2**30
        fits_host = host_fits(job, host)
    return SimResult(
        job=job,
        step_time=step,
        peak_memory=pm.total,
        memory_capacity=gpu.usable_memory_bytes,
        time_breakdown=breakdown,
        memory_breakdown={"params": pm.params, "grads": pm.grads, "optimizer": pm.optimizer,
                          "activations": pm.activations, "buffers": pm.buffers},
        executed_flops=_per_sequence_flops(model, full, sel) * job.global_batch,
        model_flops=_per_sequence_flops(model, 0, 0) * job.global_batch,
        bubble_fraction=(t_pipe - steady) / steady if steady > 0 else 0.0,
        fidelity="analytic",
        extra=extra,
        host_fits=fits_host,
    )


def _stage_memories(job: Job, groups: list[tuple[int, StageCost, int]]) -> list[tuple[int, StageMemory]]:
    """(device, memory) of the first device of each distinct stage: in-flight microbatches
    never grow with the device index, so that device is the peak of its kind."""
    return [(i, stage_memory(job.model, job.cluster, job.plan, job.m, i, c)) for i, c, _ in groups]


def memory_only(job: Job) -> float:
    """Peak bytes of the plan's most loaded rank (the planner prunes with this first)."""
    groups = stage_groups(job.model, job.cluster, job.plan)
    return max(mem.total for _, mem in _stage_memories(job, groups))
