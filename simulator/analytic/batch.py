"""The analytic estimate of many plans at once, over numpy arrays: the planner's scoring path.

:func:`simulator.analytic.estimate` (one plan, scalar) is the reference; :func:`estimate_batch`
returns the same step time, peak memory and fit for every plan of a list, agreeing to 1e-9
(tests/test_analytic_batch.py, on random plans of the built-in models and clusters). It gets
its speed from splitting each formula by what it depends on:

* terms that depend on few plan fields are computed once per distinct key by the scalar
  function that owns the rule, and broadcast to the plans that share the key: the kinds of a
  layout's pipeline devices (simulator.cost.stage.device_kinds, key p, v, schedule, ckpt, layer
  split), the layer-level times (simulator.cost.stage.block_times, key t, sp, mb, prec), the
  schedule's in-flight counts (simulator.cost.memory, plus m), the pipeline send and
  tied-embedding times (simulator.analytic.pipeline), the step-end scalar all-reduces
  (simulator.cost.step.step_sync_time) and each group's link and per-collective bandwidth and
  latency steps (simulator.cost.collectives, simulator.cost.zero3);
* the rest is combined over arrays (plans x distinct stages): the stage costs, activation
  peaks and buffers from those terms (simulator.cost.stage, simulator.cost.stage_memory), and
  what varies with every plan -- ZeRO stage, offload, hybrid sharding, d, message sizes -- with
  the formulas of simulator.analytic.data_parallel, simulator.cost.zero3, simulator.cost.memory,
  simulator.analytic.offload and simulator.cost.step written element-wise; each line below
  names the scalar function it mirrors. (Plans whose chunks differ, v > 1 with an explicit
  split, take their activation peaks from the scalar rule.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from hwprofiles.algorithms import Collective, latency_steps
from hwprofiles.schema import ClusterSpec
from simulator.analytic.data_parallel import dp_link
from simulator.analytic.pipeline import p2p_exposed, tied_embedding_time
from simulator.cost import experts, memory, params
from simulator.cost.collectives import GroupLink
from simulator.cost.eager_layer import LayerKernels
from simulator.cost.memory import DP_BUCKET_BYTES, ZERO3_LAYERS_HELD
from simulator.cost.ops import dtype_bytes
from simulator.cost.precision import fp8_layer_bytes, linear_input_bytes
from simulator.cost.rank_view import rank_model, rank_plan
from simulator.cost.stage import (
    TP_EMBEDDING,
    TP_HEAD,
    block_times,
    compute_slowdown,
    device_kinds,
    device_slowdown,
    host_async,
    kind_groups,
    stage_groups,
    tp_forward,
    tp_per_full_recompute,
    tp_per_layer,
)
from simulator.cost.stage_memory import activation_peak, layer_activations, weight_copies_held
from simulator.cost.step import (
    ADAM_HBM_BYTES_PER_PARAM,
    CPU_ADAM_STATE_BYTES,
    OFFLOAD_SUBGROUPS,
    OPTIMIZER_STEP_BYTES_PER_PARAM,
    optimizer_tensors,
    param_gather_bytes,
    step_sync_time,
)
from simulator.cost.workload import layer_param_tensors, padded_vocab_size
from simulator.cost.zero3 import fsdp2_sharded_by, reduce_bytes, shard_links
from simulator.job import OVERLAPPED, Job, Runtime
from simulator.plan import Plan
from simulator.plan.table import PlanTable
from simulator.specs import ModelSpec

__all__ = ["BatchEstimate", "estimate_batch"]

AR, AG, RS = Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER


@dataclass(frozen=True)
class BatchEstimate:
    """Per plan: analytic step time (inf when the plan does not fit in GPU memory, as the
    planner scores it), peak GPU memory, and whether GPU and host memory both fit."""

    step_time: np.ndarray
    peak_memory: np.ndarray
    fits: np.ndarray


_INT_FIELDS = ("t", "p", "d", "mb", "sp", "v", "zero", "hsdp", "fp8ag", "cp", "ep")
_OTHER_FIELDS = ("ckpt", "schedule", "offload", "prec", "layers", "recompute")


def _group(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """(the index of the first element of each distinct value of ``key``, in increasing value; each
    element's index into them), the values being integers in [0, ``bound``): np.unique's
    return_index and return_inverse, counted on a table of the ``bound`` values where it is
    small (ten times faster than np.unique's sort on the search's tens of thousands of plans)."""
    n = len(key)
    if bound > 16 * n + 1024:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)
    seen = np.zeros(bound, dtype=bool)
    seen[key] = True
    slot = np.cumsum(seen) - 1
    inverse = slot[key]
    first = np.full(int(slot[-1]) + 1 if n else 0, n, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(n))
    return first, inverse


class _Plans:
    """The plans' fields as arrays (one row per plan), read from the plans in one pass (from a
    :class:`~simulator.plan.table.PlanTable`, its columns as they are), and the grouping of the
    plans by any subset of them (:meth:`per_key`)."""

    def __init__(self, plans: Sequence[Plan], global_batch: int):
        self.plans = plans
        n = len(plans)
        self._codes: dict[str, tuple[np.ndarray, int]] = {}  # field -> (each plan's code, distinct codes)
        self._values: dict[str, dict[Any, int]] = {}  # field -> the code of each value
        if isinstance(plans, PlanTable):  # the columns as they are
            self.col = {}
            for name in _INT_FIELDS:
                values, index = plans.column(name)
                self.col[name] = np.array(values, dtype=np.int64)[index]
            for name in _OTHER_FIELDS:
                values, index = plans.column(name)
                self._values[name] = {value: j for j, value in enumerate(values)}
                self._codes[name] = (index, len(values))
        else:
            self.col = {name: np.fromiter(map(attrgetter(name), plans), np.int64, n) for name in _INT_FIELDS}
            for name in _OTHER_FIELDS:
                column = list(map(attrgetter(name), plans))
                code = self._values[name] = {value: j for j, value in enumerate(dict.fromkeys(column))}
                self._codes[name] = (np.fromiter(map(code.__getitem__, column), np.int64, n), len(code))
        c = self.col
        self.t, self.p, self.d, self.v, self.zero, self.fp8ag = c["t"], c["p"], c["d"], c["v"], c["zero"], c["fp8ag"]
        self.m = global_batch // (self.d * c["mb"])  # simulator.plan.num_microbatches
        self.shard = np.where(c["hsdp"] > 0, c["hsdp"], self.d)  # Plan.shard_group
        self.replicas = np.maximum(1, self.d // self.shard)  # Plan.replicas
        self.col["m"] = self.m

    def is_(self, name: str, value: Any) -> np.ndarray:
        """Which plans have ``value`` in the (non-integer) field ``name``."""
        code = self._values[name].get(value)
        return self._codes[name][0] == code if code is not None else np.zeros(len(self.plans), dtype=bool)

    def _code(self, name: str) -> tuple[np.ndarray, int]:
        if name not in self._codes:
            column = self.col[name]
            first, inverse = _group(column, int(column.max()) + 1 if len(column) else 0)
            self._codes[name] = (inverse, len(first))
        return self._codes[name]

    def per_key(self, names: Sequence[str], value: Callable[[Plan, int], Any]) -> tuple[list, np.ndarray]:
        """(``value(plan, i)`` of each distinct combination of the fields ``names``, for i the
        first plan that has it; the index of each plan's combination in that list)."""
        key = np.zeros(len(self.plans), dtype=np.int64)
        combinations = 1
        for name in names:  # mixed radix: each field's code a digit (fewer than 2**63 combinations)
            code, n = self._code(name)
            key = key * n + code
            combinations *= n
        first, inverse = _group(key, combinations)
        return [value(self.plans[i], int(i)) for i in first.tolist()], inverse

    def per_plan(self, names: Sequence[str], value: Callable[[Plan, int], float]) -> np.ndarray:
        """:meth:`per_key`'s values put back in the plans' order (a float per plan)."""
        values, inverse = self.per_key(names, value)
        return np.array(values, dtype=float)[inverse]


#: what a plan's pipeline devices' kinds depend on (simulator.cost.stage.device_kinds)
_SPLIT_KEY = ("p", "v", "ckpt", "layers", "recompute", "schedule")
#: what the layer-level times depend on (simulator.cost.stage.block_times)
_BLOCK_KEY = ("t", "sp", "mb", "prec")
_BLOCK_FIELDS = attrgetter(
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
)


def _stages(
    model: ModelSpec, cluster: ClusterSpec, P: _Plans, kernels: LayerKernels
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each plan's distinct stages (simulator.cost.stage.stage_groups) as (plans x G) arrays,
    G the most any plan has, and the mask of the real ones: the devices' kinds of each split
    (stage.device_kinds, stage.kind_groups) and the layer-level times of each (t, sp, mb,
    prec) (stage.block_times), combined as stage._make_stages's ``cost`` does."""
    L = model.num_layers
    groups, split_of = P.per_key(_SPLIT_KEY, lambda q, i: kind_groups(device_kinds(q, L)))
    width = max(map(len, groups))
    key, slot = np.array([(k, j) for k, gs in enumerate(groups) for j in range(len(gs))]).T
    table = np.zeros((8, len(groups), width))  # dev, count, and the kind's six fields
    table[:, key, slot] = np.array([(dev, count, *kind) for gs in groups for dev, kind, count in gs], dtype=float).T
    valid = np.zeros((len(groups), width), dtype=bool)
    valid[key, slot] = True
    dev, count, n, full, sel, first, last, turn = table[:, split_of]
    blocks, block_of = P.per_key(
        _BLOCK_KEY, lambda q, i: _BLOCK_FIELDS(block_times(model, cluster, q.t, bool(q.sp), q.mb, q.prec, kernels))
    )
    times = np.array(blocks, dtype=float)[block_of].T[:, :, None]  # field x plan x 1
    lf, lb, lbw, lac, ef, eb, ebw, hf, hb, hbw, ar, cpf, cpb, cast, ep = times
    per_t, t_of = P.per_key(("t",), lambda q, i: _rank_params(model, q.t))
    layer_p, sharded_extra, emb_p = np.array(per_t, dtype=float)[t_of].T[:, :, None]
    head_p = P.per_plan(
        ("t", "p"), lambda q, i: params.head_params_per_rank(model, q.t, q.p, padded_vocab_size(model, q.t))
    )
    # stage._make_stages's cost(), element-wise
    a2a = experts.ALL_TO_ALLS_PER_PASS * ep
    fwd = n * lf + first * ef + last * hf
    bwd = n * lb + first * eb + last * hb
    bwd_w = n * lbw + first * ebw + last * hbw
    recompute = full * lf + sel * lac
    tp = (tp_per_layer(model) * n + tp_per_full_recompute(model) * full) * ar
    tp = tp + (first * TP_EMBEDDING + last * TP_HEAD) * ar
    cp = n * (cpf + cpb) + (full + sel) * cpf
    ep_comm = (2 * n + full) * a2a
    in_forward = n * (tp_forward(model) * ar + cpf + a2a) + first * TP_EMBEDDING * ar
    stage_params = n * layer_p + first * emb_p + last * head_p[:, None]  # params.stage_params_per_rank
    return {
        "dev": dev,
        "count": count,
        "forward": fwd,
        "backward": bwd,
        "recompute": recompute,
        "total": fwd + bwd + recompute + tp + cp + ep_comm,  # StageCost.total
        "weight_cast": (n + full) * cast,
        "backward_weight": bwd_w,
        "params": stage_params,
        "sharded_params": stage_params + n * sharded_extra,  # StageShape.sharded_params
        "layers": n,
        "full_layers": full,
        "selective_layers": sel,
        "first": first,
        "last": last,
        "layer_params": n * layer_p,
        "turn": turn,
        "forward_span": fwd + in_forward,  # StageCost.forward_span
    }, valid[split_of]


def _rank_params(model: ModelSpec, t: int) -> tuple[float, float, float]:
    """A layer's parameters on one TP rank, the experts' states it shards beyond them, the
    embedding's (simulator.cost.params, with Megatron's padded vocabulary)."""
    vocab = padded_vocab_size(model, t)
    return (
        params.layer_params_per_rank(model, t),
        params.layer_sharded_extra(model, t),
        params.embedding_params_per_rank(model, t, vocab),
    )


def _schedule_counts(P: _Plans, S: dict[str, np.ndarray], valid: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per plan and stage, what its pipeline schedule fixes (simulator.cost.memory): the
    microbatches in flight (in_flight_microbatches), the weight gradients owed at that peak
    (weight_grads_pending), and the embedding's and the head's chunk's in flight
    (end_chunk_in_flight), per split and m."""
    width, groups = valid.shape[1], valid.sum(axis=1)

    def counts(q: Plan, i: int) -> list[tuple[float, float, float, float]]:
        m, out = int(P.m[i]), []
        for dev in S["dev"][i, : int(groups[i])].astype(int).tolist():
            out.append(
                (
                    memory.in_flight_microbatches(q.schedule, dev, q.p, m, q.v),
                    memory.weight_grads_pending(q.schedule, dev, q.p, m),
                    memory.end_chunk_in_flight(q.schedule, dev, q.p, m, q.v, 0),
                    memory.end_chunk_in_flight(q.schedule, dev, q.p, m, q.v, q.v - 1),
                )
            )
        return out + [(0.0, 0.0, 0.0, 0.0)] * (width - len(out))

    per, inv = P.per_key((*_SPLIT_KEY, "m"), counts)
    return tuple(np.array(per, dtype=float)[inv].transpose(2, 0, 1))


def _activations(
    model: ModelSpec,
    cluster: ClusterSpec,
    P: _Plans,
    S: dict[str, np.ndarray],
    valid: np.ndarray,
    counts: tuple[np.ndarray, ...],
) -> np.ndarray:
    """simulator.cost.stage_memory.activation_peak of each plan's stages. Equal chunks (the
    search's plans): its closed form over arrays; chunks that differ (v > 1 with an explicit
    split): the scalar rule, plan by plan."""
    e = dtype_bytes(cluster.gpu)
    s, h = model.seq_length, model.hidden_size

    def per_layer(q: Plan, i: int) -> tuple[float, ...]:
        sp = bool(q.sp)
        li = linear_input_bytes(q.prec, e)
        return (
            *layer_activations(model, q.mb, q.t, sp, e, q.prec),
            memory.weight_grad_input_bytes(model, q.mb, q.t, sp, li),  # stage_memory.pending_weight_inputs
            memory.embedding_activation_bytes(q.mb, s, h, q.t, sp),
        )

    per, inv = P.per_key(("t", "sp", "mb", "prec"), per_layer)
    pf, ps, pn, w_in, emb = (a[:, None] for a in np.array(per, dtype=float)[inv].T)
    inflight, pending, emb_inflight, _ = counts
    n, full, sel = S["layers"], S["full_layers"], S["selective_layers"]
    act = inflight * (full * pf + sel * ps + (n - full - sel) * pn) + np.where(full > 0, pn, 0.0)
    gpipe = (P.is_("schedule", "gpipe") & (P.m > 1))[:, None]
    act = act + np.where(gpipe, full * (pn - pf) + sel * (pn - ps), 0.0)
    act = act + pending * w_in * n + S["first"] * emb_inflight * emb
    uneven = (P.v > 1) & ~(P.is_("layers", None) & P.is_("recompute", None))
    for i in np.flatnonzero(uneven).tolist():
        q, m = P.plans[i], int(P.m[i])
        for j, (dev, c, _) in enumerate(stage_groups(model, cluster, q)):
            act[i, j] = activation_peak(model, cluster, q, m, dev, c)
    return np.where(valid, act, 0.0)


def _flight_buffers(
    model: ModelSpec, P: _Plans, S: dict[str, np.ndarray], e: int, loss: memory.CrossEntropy, head_inflight: np.ndarray
) -> np.ndarray:
    """simulator.cost.stage_memory.flight_buffers of each plan's stages: the last stage's logits
    per in-flight microbatch of its head's chunk, and the pipeline send/receive buffers."""
    kept, backward = memory.logits_bytes_per_element(loss, e)
    logits = P.per_plan(
        ("t", "mb"), lambda q, i: memory.logits_elements(model, q.mb, q.t, padded_vocab_size(model, q.t))
    )
    pipe = P.per_plan(
        ("mb", "p"), lambda q, i: memory.pipeline_buffer_bytes(q.mb, model.seq_length, model.hidden_size, e, q.p)
    )
    return S["last"] * logits[:, None] * (head_inflight * kept + backward) + pipe[:, None]


class _Links:
    """Per plan, 1/bandwidth and latency-steps * latency of each collective the data-parallel
    traffic uses, on its group's link (simulator.cost.collectives, simulator.cost.zero3.shard_links):
    ``dp``: all d ranks (ZeRO 0-2's gradient reduction), ``shard``: the shard group (hsdp or d
    ranks: ZeRO-3 gathers and scatters, ZeRO-1/2's parameter all-gather), ``replica``: the
    replicate group of hybrid sharding."""

    def __init__(self, cluster: ClusterSpec, P: _Plans):
        per, inv = P.per_key(("t", "d", "hsdp"), lambda q, i: self._figures(cluster, q))
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


def _views(plans: Sequence[Plan]) -> set[tuple[int, int]]:
    """The (cp, ep) pairs of the plans."""
    if isinstance(plans, PlanTable):
        (cps, cp), (eps, ep) = plans.column("cp"), plans.column("ep")
        pairs = np.flatnonzero(np.bincount(cp * len(eps) + ep, minlength=len(cps) * len(eps)))
        return {(cps[k // len(eps)], eps[k % len(eps)]) for k in pairs.tolist()}
    return {(q.cp, q.ep) for q in plans}


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
    P = _Plans(plans, global_batch)
    S, valid = _stages(model, cluster, P, runtime.layer_kernels)
    links = _Links(cluster, P)
    gpu, node = cluster.gpu, cluster.node
    e = dtype_bytes(gpu)
    sigma = gpu.comm_overlap_slowdown
    col = lambda a: a[:, None]  # a per-plan column beside the stages
    job_of = lambda q: Job(model, cluster, q, global_batch, runtime)
    offload, zero, d = ~P.is_("offload", "none"), P.zero, P.d

    # ---- memory (simulator.cost.stage_memory.stage_memory; states: memory.model_state_bytes)
    by_zero = np.array([memory.program_state_bytes(runtime.states, e, z) for z in range(4)], dtype=float)
    pb, gb, k = (col(by_zero[zero, i]) for i in range(3))  # bytes per parameter of each plan's ZeRO stage
    psi, psi_s, shard = S["params"], S["sharded_params"], col(P.shard)
    params_b = np.where(
        col(offload), np.where(col(zero == 3), 0.0, psi * pb), np.where(col(zero >= 3), psi_s * pb / shard, psi * pb)
    )
    grads_b = np.where(col(offload), 0.0, np.where(col(zero >= 2), psi_s * gb / shard, psi * gb))
    opt_b = np.where(col(offload), 0.0, np.where(col(zero >= 1), psi_s * k / shard, psi * k))
    counts = _schedule_counts(P, S, valid)
    by_schedule = _activations(model, cluster, P, S, valid, counts) + _flight_buffers(
        model, P, S, e, runtime.cross_entropy, counts[3]
    )
    # stage_memory.sharding_buffers
    bucket = np.where(col((d > 1) | offload), np.minimum(psi * memory.GRAD_BYTES, 2 * DP_BUCKET_BYTES), 0.0)
    ws = P.per_plan(("t",), lambda q, i: memory.zero3_working_set_bytes(params.layer_params_per_rank(model, q.t)))
    working = np.where(col(zero == 3), col(ws), 0.0)
    copies = weight_copies_held(runtime.weight_copy_bytes, 1.0) * psi  # bytes per parameter x the stages' parameters
    # stage_memory.fp8_weight_copies: precision.fp8_layer_bytes x precision.fp8_layers_held
    # + the layers x precision.fp8_shard_bytes
    fp8_per_layer = P.per_plan(
        ("t", "prec", "fp8ag"), lambda q, i: fp8_layer_bytes(q, params.layer_params_per_rank(model, q.t), e)
    )
    fp8_layers = np.where(col(zero == 3), np.minimum(S["layers"], ZERO3_LAYERS_HELD), S["layers"])
    fp8_shards = np.where(col((P.fp8ag == 1) & (zero == 3)), (1 - e) * S["layer_params"] / shard, 0.0)
    copies = copies + col(fp8_per_layer) * fp8_layers + fp8_shards
    stage_total = np.where(valid, params_b + grads_b + opt_b + by_schedule + bucket + working + copies, -np.inf)
    peak = stage_total.max(axis=1)

    # ---- per microbatch of each stage (simulator.analytic.pipeline_phase)
    p2p = P.per_plan(("t", "sp", "mb", "p", "d"), lambda q, i: p2p_exposed(job_of(q)))
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
        gather * (S["full_layers"] / np.maximum(S["layers"], 1))
        if runtime.zero3 == "deepspeed"
        else np.zeros_like(gather)
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
        fetch = np.where(col(P.is_("offload", "nvme")), np.maximum(fetch, nvme_fetch), fetch)
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
    saved = np.where(P.is_("schedule", "gpipe") & (P.m > 1), S["recompute"][rows, crit], 0.0)
    interleaved = P.is_("schedule", "interleaved") & (P.v > 1)
    w = S["backward_weight"]  # pipeline.weight_fill: w + f (ZB-V) or w + min(w, f)
    fill = w + np.where(col(P.is_("schedule", "zbv")), S["forward_span"], np.minimum(w, S["forward_span"]))
    total_fill = (np.where(valid, fill, 0.0) * S["count"]).sum(axis=1)
    zb = np.maximum(0.0, (total - worst) - (total_fill - fill[rows, crit]))
    # pipeline.pipeline_bubble
    zero_bubble = np.where(P.is_("schedule", "zbh1"), zb, np.where(P.is_("schedule", "zbv"), zb / 2, total - worst))
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
    opt = np.where(offload, 0.0, _optimizer_time(model, cluster, P, psi_local, layers_max, runtime))
    off = np.where(offload, _offload_time(cluster, P, psi_local), 0.0)
    tied = P.per_plan(("t", "p", "d"), lambda q, i: tied_embedding_time(job_of(q)))
    sync = P.per_plan(("t", "p", "d"), lambda q, i: step_sync_time(job_of(q)))
    step = pipe + (dp_exposed + tied + sync) + gather_after + opt + off

    # ---- fit (SimResult.fits; step.host_state_bytes, step.host_fits)
    cap = gpu.usable_memory_bytes
    host = node.gpus_per_node * psi_local * (CPU_ADAM_STATE_BYTES + np.where(zero == 3, 2, 0))
    host_ok = ~offload | P.is_("offload", "nvme") | (host <= node.host_memory_GiB * 2**30)
    gpu_ok = peak <= cap
    out = BatchEstimate(np.where(gpu_ok, step, np.inf), peak, gpu_ok & host_ok)
    return _scalar_where(out, _fsdp2_program(P, cluster, runtime), model, cluster, plans, global_batch, runtime)


def _fsdp2_program(P: _Plans, cluster: ClusterSpec, runtime: Runtime) -> np.ndarray:
    """The plans whose FSDP2 sharding the arrays above do not price: FSDP2's ZeRO-2
    (``runtime.zero2``) and, on a synchronous (CPU) host, FSDP2's ZeRO-3, whose collectives and
    hooks run on the rank's thread (simulator.cost.zero3.Zero3Pass ``serial``, ``host``)."""
    return fsdp2_sharded_by(P.d, P.zero, runtime) & ((P.zero == 2) | (not host_async(cluster)))


def _scalar_where(
    out: BatchEstimate,
    mask: np.ndarray,
    model: ModelSpec,
    cluster: ClusterSpec,
    plans: Sequence[Plan],
    global_batch: int,
    runtime: Runtime,
) -> BatchEstimate:
    """``out`` with the plans of ``mask`` priced by the scalar estimate (the reference), one by one."""
    if not mask.any():
        return out
    from simulator.analytic import estimate

    rows = list(plans)
    for i in np.flatnonzero(mask).tolist():
        r = estimate(Job(model, cluster, rows[i], global_batch, runtime))
        fits_gpu = r.peak_memory <= cluster.gpu.usable_memory_bytes
        out.step_time[i] = r.step_time if fits_gpu else np.inf
        out.peak_memory[i] = r.peak_memory
        out.fits[i] = r.fits
    return out


def _optimizer_time(
    model: ModelSpec, cluster: ClusterSpec, P: _Plans, psi_local: np.ndarray, layers: np.ndarray, runtime: Runtime
) -> np.ndarray:
    """simulator.cost.step.optimizer_time over arrays."""
    gpu = cluster.gpu
    eager = gpu.eager
    # step.optimizer_tensors is linear in the layers: its value at 0 plus the layers' tensors
    tensors = optimizer_tensors(model, 0) + layers.astype(float) * layer_param_tensors(model)
    tp = (P.t > 1) | fsdp2_sharded_by(P.d, P.zero, runtime)  # step.dtensor_params
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
            P.is_("offload", "nvme"),
            2
            * node.gpus_per_node
            * psi_local
            * memory.OPTIMIZER_BYTES_PER_PARAM
            / (node.nvme.count * node.nvme.bandwidth_GBps * 1e9),
            0.0,
        )
    k = OFFLOAD_SUBGROUPS
    return down + (cpu + up + nvme) / k + (k - 1) / k * np.maximum(np.maximum(cpu, up), nvme)
