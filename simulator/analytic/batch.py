"""The analytic estimate of many plans at once, over numpy arrays: the planner's scoring path.

:func:`simulator.analytic.estimate` (one plan, scalar) is the reference; :func:`estimate_batch`
returns the same step time, peak memory and fit for every plan of a list, agreeing to 1e-9
(tests/test_analytic_batch.py, on random plans of the built-in models and clusters). It gets
its speed from splitting each formula by what it depends on:

* terms that depend on few plan fields are computed once per distinct key by the scalar
  function that owns the rule, and broadcast to the plans that share the key: the stage costs
  (simulator.cost.stage.stage_groups, key t, sp, mb, p, v, ckpt, layer split), the
  activation peak and the schedule's buffers (simulator.cost.stage_memory, plus m and the
  stage), the pipeline send and tied-embedding times (simulator.analytic.pipeline), the
  step-end scalar all-reduces (simulator.cost.step.step_sync_time) and each group's link and
  per-collective bandwidth and latency steps (simulator.cost.collectives, simulator.cost.zero3);
* what varies with every plan -- ZeRO stage, offload, hybrid sharding, d, message sizes --
  is combined over arrays (plans x distinct stages), with the formulas of
  simulator.analytic.data_parallel, simulator.cost.zero3, simulator.cost.memory,
  simulator.analytic.offload and simulator.cost.step written element-wise; each line below
  names the scalar function it mirrors.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hwprofiles.algorithms import Collective, latency_steps
from hwprofiles.schema import ClusterSpec
from simulator.analytic.data_parallel import dp_link
from simulator.analytic.pipeline import p2p_exposed, tied_embedding_time
from simulator.cost import memory, params
from simulator.cost.collectives import GroupLink
from simulator.cost.memory import DP_BUCKET_BYTES, ZERO3_LAYERS_HELD
from simulator.cost.ops import dtype_bytes
from simulator.cost.precision import fp8_layer_bytes
from simulator.cost.rank_view import rank_model, rank_plan
from simulator.cost.stage import compute_slowdown, device_slowdown, host_async, stage_groups
from simulator.cost.stage_memory import activation_peak, flight_buffers, weight_copies_held
from simulator.cost.step import (
    ADAM_HBM_BYTES_PER_PARAM,
    CPU_ADAM_STATE_BYTES,
    OFFLOAD_SUBGROUPS,
    OPTIMIZER_STEP_BYTES_PER_PARAM,
    optimizer_tensors,
    param_gather_bytes,
    step_sync_time,
)
from simulator.cost.workload import layer_param_tensors
from simulator.cost.zero3 import reduce_bytes, shard_links
from simulator.job import OVERLAPPED, Job, Runtime
from simulator.plan import Plan
from simulator.specs import ModelSpec

__all__ = ["BatchEstimate", "estimate_batch"]

AR, AG, RS = Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER
_STAGE_FIELDS = (
    "dev",
    "count",
    "forward",
    "backward",
    "recompute",
    "total",
    "weight_cast",
    "backward_weight",
    "params",
    "sharded_params",
    "layers",
    "full",
    "first",
    "last",
    "layer_params",
    "turn",
    "forward_span",
)


@dataclass(frozen=True)
class BatchEstimate:
    """Per plan: analytic step time (inf when the plan does not fit in GPU memory, as the
    planner scores it), peak GPU memory, and whether GPU and host memory both fit."""

    step_time: np.ndarray
    peak_memory: np.ndarray
    fits: np.ndarray


def _per_key(keys: Sequence[Hashable], value: Callable[[int], Any]) -> tuple[list, np.ndarray]:
    """(``value(i)`` of each distinct key, i the first plan with that key; the index of each
    plan's key in that list)."""
    index: dict[Hashable, int] = {}
    inverse = np.array([index.setdefault(key, len(index)) for key in keys], dtype=np.int64)
    _, first = np.unique(inverse, return_index=True)
    return [value(int(i)) for i in first], inverse


class _Plans:
    """The plans' fields as arrays (one row per plan)."""

    def __init__(self, plans: Sequence[Plan], global_batch: int):
        cols = np.array(
            [(q.t, q.p, q.d, q.mb, q.sp, q.v, q.zero, q.hsdp, q.fp8ag) for q in plans], dtype=np.int64
        ).reshape(-1, 9)
        self.t, self.p, self.d, self.mb, self.sp, self.v, self.zero, self.hsdp, self.fp8ag = cols.T
        self.offload = np.array([q.offload for q in plans])
        self.schedule = np.array([q.schedule for q in plans])
        self.m = global_batch // (self.d * self.mb)  # simulator.plan.num_microbatches
        self.shard = np.where(self.hsdp > 0, self.hsdp, self.d)  # Plan.shard_group
        self.replicas = np.maximum(1, self.d // self.shard)  # Plan.replicas


def _stages(model: ModelSpec, cluster: ClusterSpec, plans: Sequence[Plan]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each plan's distinct stages (simulator.cost.stage.stage_groups) as (plans x G) arrays,
    G the most any plan has, and the mask of the real ones."""
    keys = [(q.t, q.sp, q.mb, q.p, q.v, q.ckpt, q.layers, q.recompute, q.prec, q.schedule == "zbv") for q in plans]
    groups, inv = _per_key(keys, lambda i: stage_groups(model, cluster, plans[i]))
    width = max(len(g) for g in groups)
    table = np.zeros((len(groups), width, len(_STAGE_FIELDS)))
    valid = np.zeros((len(groups), width), dtype=bool)
    for k, gs in enumerate(groups):
        for j, (dev, c, count) in enumerate(gs):
            table[k, j] = (
                dev,
                count,
                c.forward,
                c.backward,
                c.recompute,
                c.total,
                c.weight_cast,
                c.backward_weight,
                c.params,
                c.sharded_params,
                c.layers,
                c.full_layers,
                c.first,
                c.last,
                c.layer_params,
                c.turn,
                c.forward_span,
            )
            valid[k, j] = True
    rows = table[inv]
    return {name: rows[:, :, f] for f, name in enumerate(_STAGE_FIELDS)}, valid[inv]


class _Links:
    """Per plan, 1/bandwidth and latency-steps * latency of each collective the data-parallel
    traffic uses, on its group's link (simulator.cost.collectives, simulator.cost.zero3.shard_links):
    ``dp``: all d ranks (ZeRO 0-2's gradient reduction), ``shard``: the shard group (hsdp or d
    ranks: ZeRO-3 gathers and scatters, ZeRO-1/2's parameter all-gather), ``replica``: the
    replicate group of hybrid sharding."""

    def __init__(self, cluster: ClusterSpec, plans: Sequence[Plan]):
        keys = [(q.t, q.d, q.hsdp) for q in plans]
        per, inv = _per_key(keys, lambda i: self._figures(cluster, plans[i]))
        self._table = np.array(per)[inv]  # plans x (role, op) x (1/bw, latency seconds)
        self._index = {key: j for j, key in enumerate(self._roles())}

    @staticmethod
    def _roles() -> list[tuple[str, Collective]]:
        return [("dp", AR), ("dp", RS), ("shard", AG), ("shard", RS), ("replica", AR)]

    @classmethod
    def _figures(cls, cluster: ClusterSpec, plan: Plan) -> list[tuple[float, float]]:
        links = shard_links(cluster, plan)
        where: dict[str, tuple[GroupLink | None, int]] = {
            "dp": (dp_link(cluster, plan), plan.d),
            "shard": (links.shard, links.n),
            "replica": (links.replica, links.replicas),
        }
        out = []
        for role, op in cls._roles():
            link, n = where[role]
            if link is None or n <= 1:
                out.append((0.0, 0.0))
                continue
            bw, lat = link.figures(op)
            out.append((1.0 / bw, latency_steps(n, op, link.trees) * lat))
        return out

    def time(self, role: str, op: Collective, size: np.ndarray, n: np.ndarray) -> np.ndarray:
        """simulator.cost.collectives.collective_time of ``size`` bytes over ``n`` ranks
        (plans x stages, or plans)."""
        fig = self._table[:, self._index[(role, op)]]
        inv_bw, lat = fig[:, 0], fig[:, 1]
        if size.ndim == 2:
            inv_bw, lat, n = inv_bw[:, None], lat[:, None], n[:, None]
        frac = (2 if op == AR else 1) * (n - 1) / n
        return np.where((n > 1) & (size > 0), frac * size * inv_bw + lat, 0.0)


def _overlap_cost(compute: np.ndarray, comm: np.ndarray, sigma: float) -> np.ndarray:
    """simulator.cost.overlap.overlap_cost: max(C + sigma min(K, C), K) - C, 0 without traffic."""
    return np.where(comm <= 0, 0.0, np.maximum(compute + sigma * np.minimum(comm, compute), comm) - compute)


def _per_plan(keys: Sequence[Hashable], value: Callable[[int], float]) -> np.ndarray:
    values, inv = _per_key(keys, value)
    return np.array(values, dtype=float)[inv]


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
        r = estimate_batch(rank_model(model, cp, ep), cluster, ranked, global_batch * cp, runtime)
        step[idx], peak[idx], fits[idx] = r.step_time, r.peak_memory, r.fits
    return BatchEstimate(step, peak, fits)


def estimate_batch(
    model: ModelSpec, cluster: ClusterSpec, plans: Sequence[Plan], global_batch: int, runtime: Runtime = OVERLAPPED
) -> BatchEstimate:
    """The analytic step time, peak memory and fit of every plan (module docstring); plans with
    context or expert parallelism priced as one rank sees them (simulator.cost.rank_view), each
    (cp, ep) apart."""
    if not plans:
        empty = np.zeros(0)
        return BatchEstimate(empty, empty, np.zeros(0, dtype=bool))
    views = {(q.cp, q.ep) for q in plans}
    if views != {(1, 1)}:
        return _by_view(model, cluster, plans, global_batch, runtime, sorted(views))
    P = _Plans(plans, global_batch)
    S, valid = _stages(model, cluster, plans)
    links = _Links(cluster, plans)
    gpu, node = cluster.gpu, cluster.node
    e = dtype_bytes(gpu)
    sigma = gpu.comm_overlap_slowdown
    col = lambda a: a[:, None]  # a per-plan column beside the stages
    job_of = lambda i: Job(model, cluster, plans[i], global_batch, runtime)
    offload, zero, d = P.offload != "none", P.zero, P.d

    # ---- memory (simulator.cost.stage_memory.stage_memory; states: memory.model_state_bytes)
    by_zero = np.array([memory.program_state_bytes(runtime.states, e, z) for z in range(4)], dtype=float)
    pb, gb, k = (col(by_zero[zero, i]) for i in range(3))  # bytes per parameter of each plan's ZeRO stage
    psi, psi_s, shard = S["params"], S["sharded_params"], col(P.shard)
    params_b = np.where(
        col(offload), np.where(col(zero == 3), 0.0, psi * pb), np.where(col(zero >= 3), psi_s * pb / shard, psi * pb)
    )
    grads_b = np.where(col(offload), 0.0, np.where(col(zero >= 2), psi_s * gb / shard, psi * gb))
    opt_b = np.where(col(offload), 0.0, np.where(col(zero >= 1), psi_s * k / shard, psi * k))
    loss = runtime.cross_entropy
    width = valid.shape[1]
    sched_keys = [
        (q.t, q.sp, q.mb, q.p, q.v, q.ckpt, q.layers, q.recompute, q.prec, q.schedule, m)
        for q, m in zip(plans, P.m.tolist())
    ]

    def schedule_memory(i: int) -> list[float]:
        q, m = plans[i], int(P.m[i])
        out = []
        for dev, c, _ in stage_groups(model, cluster, q):
            out.append(
                activation_peak(model, cluster, q, m, dev, c) + flight_buffers(model, cluster, q, m, dev, c.last, loss)
            )
        return out + [0.0] * (width - len(out))

    fixed_mem, inv = _per_key(sched_keys, schedule_memory)
    by_schedule = np.array(fixed_mem)[inv]
    # stage_memory.sharding_buffers
    bucket = np.where(col((d > 1) | offload), np.minimum(psi * memory.GRAD_BYTES, 2 * DP_BUCKET_BYTES), 0.0)
    ws = _per_plan(
        [q.t for q in plans], lambda i: memory.zero3_working_set_bytes(params.layer_params_per_rank(model, plans[i].t))
    )
    working = np.where(col(zero == 3), col(ws), 0.0)
    copies = weight_copies_held(runtime.weight_copy_bytes, 1.0) * psi  # bytes per parameter x the stages' parameters
    # stage_memory.fp8_weight_copies: precision.fp8_layer_bytes x precision.fp8_layers_held
    # + the layers x precision.fp8_shard_bytes
    fp8_per_layer = _per_plan(
        [(q.t, q.prec, q.fp8ag) for q in plans],
        lambda i: fp8_layer_bytes(plans[i], params.layer_params_per_rank(model, plans[i].t), e),
    )
    fp8_layers = np.where(col(zero == 3), np.minimum(S["layers"], ZERO3_LAYERS_HELD), S["layers"])
    fp8_shards = np.where(col((P.fp8ag == 1) & (zero == 3)), (1 - e) * S["layer_params"] / shard, 0.0)
    copies = copies + col(fp8_per_layer) * fp8_layers + fp8_shards
    stage_total = np.where(valid, params_b + grads_b + opt_b + by_schedule + bucket + working + copies, -np.inf)
    peak = stage_total.max(axis=1)

    # ---- per microbatch of each stage (simulator.analytic.pipeline_phase)
    p2p = _per_plan([(q.t, q.sp, q.mb, q.p, q.d) for q in plans], lambda i: p2p_exposed(job_of(i)))
    sends = np.where(col(P.p == 1), 0.0, 2 * col(P.v) - S["first"] - S["last"] - 2 * S["turn"])  # pipeline.p2p_sends
    bwd = S["total"] - S["forward_span"]  # StageCost.backward_span
    rb = reduce_bytes(runtime, e)
    pgb = param_gather_bytes(e)
    # analytic.data_parallel.stage_gathered_bytes: precision.gathered_bytes of each stage
    gathered = psi * pgb - np.where(col(P.fp8ag == 1), (pgb - 1) * S["layer_params"], 0.0)

    def sharded_reduce(size: np.ndarray) -> np.ndarray:  # zero3.sharded_reduce_time
        out = links.time("shard", RS, size, P.shard)
        return out + np.where(col(P.replicas > 1), links.time("replica", AR, size / shard, P.replicas), 0.0)

    # ZeRO-2: a reduce-scatter per microbatch (data_parallel.per_microbatch_dp)
    scatter2 = sharded_reduce(psi * rb)
    z2 = _overlap_cost(bwd, scatter2, sigma) if runtime.dp_overlap else scatter2
    # ZeRO-3: per-unit gathers and scatters (zero3.zero3_pass, Zero3Pass.exposed)
    units = np.maximum(S["layers"] + np.maximum(S["first"], S["last"]), 1)  # zero3.units (1: padding)
    gather = units * links.time("shard", AG, gathered / units, P.shard)
    scatter3 = units * sharded_reduce(psi * rb / units)
    regather = (
        gather * (S["full"] / np.maximum(S["layers"], 1)) if runtime.zero3 == "deepspeed" else np.zeros_like(gather)
    )
    copy_out = (
        2 * gathered / (gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_efficiency) if runtime.zero3 == "fsdp2" else 0.0
    )
    g, r = gather / units, scatter3 / units
    z3 = (g + _overlap_cost(S["forward_span"], gather - g, sigma) + copy_out) + (
        g + r + _overlap_cost(bwd, gather + regather + scatter3 - g - r, sigma) + copy_out
    )
    z_exp = np.where(col(d > 1), np.where(col(zero == 2), z2, np.where(col(zero == 3), z3, 0.0)), 0.0)
    # ZeRO-Infinity's parameter fetch (offload.offloaded_param_fetch)
    shard_bytes = psi * 2 / col(d)
    fetch = shard_bytes / node.pcie.bytes_per_s
    if node.nvme is not None:
        nvme_fetch = shard_bytes * node.gpus_per_node / (node.nvme.count * node.nvme.bandwidth_GBps * 1e9)
        fetch = np.where(col(P.offload == "nvme"), np.maximum(fetch, nvme_fetch), fetch)
    fetch_exp = np.maximum(0.0, fetch - S["forward"]) + np.maximum(0.0, fetch - S["backward"] - S["recompute"])
    z_exp = z_exp + np.where(col(offload & (zero == 3)), fetch_exp, 0.0)

    # simulator.analytic.weight_casts: the fp8 weight casts of a program that does not cache them
    # (precision.casts_every_forward: none with fp8 parameters; bf16 stages have none)
    casts = 0.0 if runtime.fp8_weight_cache else np.where(col(P.fp8ag == 1), 0.0, S["weight_cast"])
    per_mb = np.where(valid, S["total"] + casts + sends * col(p2p) + z_exp, -np.inf)
    crit = per_mb.argmax(axis=1)
    rows = np.arange(len(plans))
    worst = per_mb[rows, crit]
    total = (np.where(valid, per_mb, 0.0) * S["count"]).sum(axis=1)
    saved = np.where((P.schedule == "gpipe") & (P.m > 1), S["recompute"][rows, crit], 0.0)
    interleaved = (P.schedule == "interleaved") & (P.v > 1)
    w = S["backward_weight"]  # pipeline.weight_fill: w + f (ZB-V) or w + min(w, f)
    fill = w + np.where(col(P.schedule == "zbv"), S["forward_span"], np.minimum(w, S["forward_span"]))
    total_fill = (np.where(valid, fill, 0.0) * S["count"]).sum(axis=1)
    zb = np.maximum(0.0, (total - worst) - (total_fill - fill[rows, crit]))
    # pipeline.pipeline_bubble
    zero_bubble = np.where(P.schedule == "zbh1", zb, np.where(P.schedule == "zbv", zb / 2, total - worst))
    bubble = np.where(interleaved, (total - worst) / P.v, zero_bubble)
    pipe = P.m * worst - saved + bubble

    # ---- data-parallel exposure of ZeRO 0-2 (simulator.analytic.dp_exposure, data_parallel.dp_times)
    grad_bytes = psi * e
    reduce_all = np.where(col(zero == 0), links.time("dp", AR, grad_bytes, d), links.time("dp", RS, grad_bytes, d))
    gather_t = np.where(col(zero == 0), 0.0, links.time("shard", AG, gathered, P.shard))
    reduce_t = np.where(col(zero <= 1), reduce_all, 0.0)
    # data_parallel.last_bucket_bytes / last_bucket_reduce_time
    rest = np.fmod(grad_bytes, DP_BUCKET_BYTES)
    last = np.where(grad_bytes <= DP_BUCKET_BYTES, grad_bytes, np.where(rest > 0, rest, DP_BUCKET_BYTES))
    last_t = np.where(col(zero == 0), links.time("dp", AR, last, d), links.time("dp", RS, last, d))
    last_reduce = np.where(col(zero >= 2), 0.0, np.where(last >= grad_bytes, reduce_t, last_t))
    behind = S["dev"] * (bwd + col(p2p))
    hidden = bwd if runtime.dp_overlap else np.zeros_like(bwd)
    contention = sigma * np.minimum(reduce_t, hidden)
    exposed_g = np.maximum(np.maximum(reduce_t - hidden - behind, last_reduce - behind), contention)
    active = col((d > 1) & (zero < 3)) & valid
    dp_exposed = np.maximum(0.0, np.where(active, exposed_g, 0.0).max(axis=1))
    gather_after = np.maximum(0.0, np.where(active, gather_t, 0.0).max(axis=1))

    # ---- step end (simulator.analytic.step_end)
    psi_max = np.where(valid, psi, -np.inf).max(axis=1)
    psi_s_max = np.where(valid, psi_s, -np.inf).max(axis=1)
    psi_local = np.where(zero >= 1, psi_s_max / P.shard, psi_max)  # step.local_params
    layers_max = np.where(valid, S["layers"], 0).max(axis=1)
    opt = np.where(offload, 0.0, _optimizer_time(model, cluster, P, psi_local, layers_max))
    off = np.where(offload, _offload_time(cluster, P, psi_local), 0.0)
    tied = _per_plan([(q.t, q.p, q.d) for q in plans], lambda i: tied_embedding_time(job_of(i)))
    sync = _per_plan([(q.t, q.p, q.d) for q in plans], lambda i: step_sync_time(job_of(i)))
    step = pipe + (dp_exposed + tied + sync) + gather_after + opt + off

    # ---- fit (SimResult.fits; step.host_state_bytes, step.host_fits)
    cap = gpu.usable_memory_bytes
    host = node.gpus_per_node * psi_local * (CPU_ADAM_STATE_BYTES + np.where(zero == 3, 2, 0))
    host_ok = ~offload | (P.offload == "nvme") | (host <= node.host_memory_GiB * 2**30)
    gpu_ok = peak <= cap
    return BatchEstimate(np.where(gpu_ok, step, np.inf), peak, gpu_ok & host_ok)


def _optimizer_time(
    model: ModelSpec, cluster: ClusterSpec, P: _Plans, psi_local: np.ndarray, layers: np.ndarray
) -> np.ndarray:
    """simulator.cost.step.optimizer_time over arrays."""
    gpu = cluster.gpu
    eager = gpu.eager
    # step.optimizer_tensors is linear in the layers: its value at 0 plus the layers' tensors
    tensors = optimizer_tensors(model, 0) + layers.astype(float) * layer_param_tensors(model)
    tp = P.t > 1
    dev = device_slowdown(cluster)
    if eager is not None and eager.optimizer_param_ns is not None:
        host = tensors * np.where(tp, eager.optimizer_us(True), eager.optimizer_us(False)) * 1e-6
        work = psi_local * eager.optimizer_param_ns * 1e-9 * dev
        step = np.maximum(host, work) if host_async(cluster) else host + work
        return step * compute_slowdown(cluster)
    per_param = OPTIMIZER_STEP_BYTES_PER_PARAM if dtype_bytes(gpu) <= 2 else ADAM_HBM_BYTES_PER_PARAM
    stream = per_param * psi_local / (gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_efficiency) * dev
    per_tensor_us = np.where(tp, eager.optimizer_us(True), eager.optimizer_us(False)) if eager else gpu.kernel_launch_us
    return (stream + tensors * per_tensor_us * 1e-6) * compute_slowdown(cluster)


def _offload_time(cluster: ClusterSpec, P: _Plans, psi_local: np.ndarray) -> np.ndarray:
    """simulator.analytic.offload.offload_time over arrays (phases that a plan does not run are 0,
    which changes neither their sum nor, all phases being positive, their maximum)."""
    node = cluster.node
    pcie = node.pcie.bytes_per_s
    down = psi_local * 2 / pcie + node.pcie.latency_s
    cpu = node.gpus_per_node * psi_local * CPU_ADAM_STATE_BYTES / (node.cpu_adam_GBps * 1e9)
    up = np.where(P.zero < 3, psi_local * 2 / pcie + node.pcie.latency_s, 0.0)
    nvme = np.zeros_like(psi_local)
    if node.nvme is not None:
        nvme = np.where(
            P.offload == "nvme",
            2
            * node.gpus_per_node
            * psi_local
            * memory.OPTIMIZER_BYTES_PER_PARAM
            / (node.nvme.count * node.nvme.bandwidth_GBps * 1e9),
            0.0,
        )
    k = OFFLOAD_SUBGROUPS
    return down + (cpu + up + nvme) / k + (k - 1) / k * np.maximum(np.maximum(cpu, up), nvme)
