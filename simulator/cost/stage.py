"""Per-stage, per-microbatch costs shared by the analytic estimator and the planner.

For one pipeline device (its v chunks together) and one microbatch: forward and backward
compute time, recomputation time, TP communication time, and the memory the stage holds.
Layer-level times are cached per (model, GPU profile, t, sp, mb) because the search asks
for the same ones thousands of times.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, context, experts, layout, params
from simulator.cost.attention import attention_ops
from simulator.cost.cache import IdentityCache
from simulator.cost.eager_layer import EAGER, LayerKernels, eager_layer_ops
from simulator.cost.ops import PassTimes, dtype_bytes, pass_times
from simulator.cost.precision import FP8, weight_cast_op
from simulator.cost.rank_view import context_parallel
from simulator.cost.schedules import chunk_rank, rank_chunks
from simulator.cost.stage_memory import StageShape
from simulator.cost.variability import slowest_gpu_factor
from simulator.cost.workload import (
    embedding_backward_extra_ops,
    embedding_forward_ops,
    head_backward_extra_ops,
    head_forward_ops,
    layer_backward_extra_ops,
    layer_forward_ops,
    padded_vocab_size,
)
from simulator.plan import Plan
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class BlockTimes:
    """Seconds per microbatch on one TP rank: a transformer layer, the embedding, the head;
    and one TP all-reduce of the b*s*h activation (an all-gather + reduce-scatter with SP)."""

    layer: PassTimes
    embedding: PassTimes
    head: PassTimes
    tp_all_reduce: float
    act_bytes: float  # b*s*h*e: one boundary activation
    cp_forward: float = 0.0  # context parallelism: what the K/V ring adds to a layer's forward attention
    cp_backward: float = 0.0  # and to its backward (simulator.cost.context.ring_exposure)
    fp8_weight_cast: float = 0.0  # prec=fp8: one forward's cast of a layer's weights, where not cached
    ep_all_to_all: float = 0.0  # expert parallelism: one token all-to-all (simulator.cost.experts)


# Tensor-parallel all-reduces of b*s*h per microbatch (Narayanan et al. 2021, section 3.2; with
# sequence parallelism each is an all-gather + reduce-scatter pair, Korthikanti et al. 2022):
def tp_forward(model: ModelSpec) -> float:
    """Per layer forward: after attention and after the MLP (the g operators): 2; a mixture of
    experts' MLP moves its k routed copies (simulator.cost.experts.mlp_tensor_collectives)."""
    return 1 + experts.mlp_tensor_collectives(model)


def tp_backward(model: ModelSpec) -> float:
    """Per layer backward: the f operators' conjugates, as many as forward."""
    return tp_forward(model)


def tp_per_layer(model: ModelSpec) -> float:
    return tp_forward(model) + tp_backward(model)


def tp_per_full_recompute(model: ModelSpec) -> float:
    """A fully recomputed layer runs its forward's again."""
    return tp_forward(model)


TP_EMBEDDING = 1  # the vocab-parallel embedding's forward
TP_HEAD = 1  # the vocab-parallel LM head's backward

_BLOCKS = IdentityCache(4096)
_STAGES = IdentityCache(8192)


def compute_slowdown(cluster: ClusterSpec) -> float:
    """Ranks sharing a processor slow each other: max(1, ranks per node / compute slots at that
    many ranks)."""
    slots = cluster.node.slots_for(cluster.gpus_per_node)
    return max(1.0, cluster.gpus_per_node / slots) if slots else 1.0


def device_slowdown(cluster: ClusterSpec) -> float:
    """How much longer the device's work takes than one GPU's kernels alone: the job runs at its
    slowest GPU's pace (simulator.cost.variability, the GPU profile's ``speed_spread`` over the
    cluster's GPUs). The host's issuing of kernels is not slowed."""
    return slowest_gpu_factor(cluster.num_gpus, cluster.gpu.speed_spread)


def host_async(cluster: ClusterSpec) -> bool:
    """Does the device run asynchronously to its host? True for GPUs (NCCL nodes): the host
    enqueues kernels ahead; False for CPU ranks (gloo nodes), which execute their own ops."""
    return cluster.node.backend != "gloo"


def block_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    t: int,
    sp: bool,
    mb: int,
    prec: str = "bf16",
    kernels: LayerKernels = "fused",
) -> BlockTimes:
    """Per-microbatch times of a layer, the embedding and the head on one TP rank (cached).
    The head's vocabulary is Megatron's padded one (workload.padded_vocab_size); ``prec``: the
    plan's precision (fp8 linear layers, simulator.cost.precision); ``kernels``: the kernels a
    layer runs (simulator.job.Runtime.layer_kernels; "eager" adds simulator.cost.eager_layer's ops)."""
    return _BLOCKS.get_or_make(
        (model, cluster), (t, sp, mb, prec, kernels), lambda: _block_times(model, cluster, t, sp, mb, prec, kernels)
    )


def _block_times(
    model: ModelSpec, cluster: ClusterSpec, t: int, sp: bool, mb: int, prec: str, kernels: LayerKernels
) -> BlockTimes:
    gpu = cluster.gpu
    e = dtype_bytes(gpu)
    slow, dev = compute_slowdown(cluster), device_slowdown(cluster)
    act = mb * model.seq_length * model.hidden_size * e
    link = collectives.in_pass_link(cluster, layout.tp_shape(t, cluster.gpus_per_node))
    asy = host_async(cluster)
    vocab = padded_vocab_size(model, t)
    layer_params = params.layer_params_per_rank(model, t)
    layer_extra = layer_backward_extra_ops(model, mb, t, sp, e, layer_params)
    eager_ops = eager_layer_ops(model, mb, t, sp, layer_params, e) if kernels == EAGER else []
    eager = gpu.eager
    cp_f, cp_b = _ring_exposure(model, cluster, t, mb, e, slow, asy, dev)
    cast = pass_times([weight_cast_op(model, t, e)], gpu, slow, (), asy, None, dev).forward if prec == FP8 else 0.0
    bt = BlockTimes(
        layer=pass_times(
            layer_forward_ops(model, mb, t, sp, e, prec) + eager_ops,
            gpu,
            slow,
            layer_extra,
            asy,
            eager.layer_us(t > 1, llama=model.normalization == "RMSNorm") if eager else None,
            dev,
        ),
        embedding=pass_times(
            embedding_forward_ops(model, mb, t, sp, e),
            gpu,
            slow,
            embedding_backward_extra_ops(model, t, e, vocab),
            asy,
            (eager.embedding_forward_us, eager.embedding_backward_us) if eager else None,
            dev,
        ),
        head=pass_times(
            head_forward_ops(model, mb, t, sp, e, vocab),
            gpu,
            slow,
            head_backward_extra_ops(model, t, e, vocab),
            asy,
            (eager.head_forward_us, eager.head_backward_us) if eager else None,
            dev,
        ),
        tp_all_reduce=collectives.all_reduce_time(act, t, link),
        act_bytes=act,
        cp_forward=cp_f,
        cp_backward=cp_b,
        fp8_weight_cast=cast,
        ep_all_to_all=experts.all_to_all_time(model, cluster, mb, t, e),
    )
    return bt


def _ring_exposure(
    model: ModelSpec, cluster: ClusterSpec, t: int, mb: int, e: int, slow: float, asy: bool, dev: float
) -> tuple[float, float]:
    """Context parallelism's ring beside one layer's attention (forward, backward), priced
    against that attention's own kernels (simulator.cost.context.ring_exposure); 0 at cp = 1. A
    CPU rank (not ``asy``) runs its own ops and collectives one after another: nothing overlaps."""
    if context_parallel(model) == 1:
        return 0.0, 0.0
    if not asy:
        return context.ring_times(model, cluster, t, mb, e)
    heads = model.num_attention_heads // t
    attn = pass_times(attention_ops(model, mb, heads, e), cluster.gpu, slow, (), asy, None, dev)
    return context.ring_exposure(model, cluster, t, mb, e, (attn.forward, attn.backward))


@dataclass(frozen=True)
class StageCost(StageShape):
    """One pipeline device, one microbatch (all its chunks): its shape (layers, recomputation,
    parameters, embedding/head) and its times."""

    forward: float = 0.0  # compute, no communication
    backward: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0  # forward + backward + recompute TP collectives
    backward_weight: float = 0.0  # the weight-gradient part of backward (ZB-H1's W passes)
    cp_comm: float = 0.0  # forward + backward + recompute exposed context-parallel ring time
    # prec=fp8 without cached weight copies (simulator.job.Runtime.fp8_weight_cache): the casts of
    # the layers' weights in every forward and full recompute; not in ``total`` (runtime-dependent)
    weight_cast: float = 0.0
    ep_comm: float = 0.0  # forward + backward + full recompute token all-to-alls (expert parallelism)
    layer_params: float = 0.0  # the parameters of its transformer layers on one rank (fp8 parameters' gathers)
    turn: bool = False  # ZB-V's last rank: its two chunks meet there, two pipeline sends fewer per microbatch
    forward_comm: float = 0.0  # the forward pass's share of tp_comm, cp_comm and ep_comm

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm

    @property
    def forward_span(self) -> float:
        """The forward pass on the compute stream: its compute and the collectives inside it (TP,
        the cp ring, the ep all-to-alls). Data-parallel and ZeRO traffic runs beside all of it, at
        the contention price of simulator.cost.overlap (the DES's pass pieces hold the same)."""
        return self.forward + self.forward_comm

    @property
    def backward_span(self) -> float:
        """The backward and recompute passes on the compute stream, collectives included: what
        gradient reductions and ZeRO-3 gathers hide behind (:attr:`forward_span`)."""
        return self.total - self.forward_span


def device_layers(plan: Plan, num_layers: int) -> tuple[list[int], list[int], list[int]]:
    """Per pipeline device (its chunks: simulator.cost.schedules.rank_chunks), its layers and its fully and
    selectively recomputed layers. The uniform split in closed form: with
    base, extra = divmod(L, p*v), chunk c holds base + [c < extra] layers, so device dev holds
    v*base + #{k < v : dev + k*p < extra} (with v > 1, p*v divides L: extra = 0, whatever the
    chunks' placement)."""
    p, v = plan.p, plan.v
    if plan.layers is None and plan.recompute is None:
        base, extra = divmod(num_layers, p * v)
        ns = [v * base + min(v, max(0, -(-(extra - dev) // p))) for dev in range(p)]
        zeros = [0] * p
        return ns, ns if plan.ckpt == "full" else zeros, ns if plan.ckpt == "selective" else zeros
    sizes, rec = plan.chunk_layers(num_layers), plan.chunk_recompute(num_layers)
    chunks = rank_chunks(plan.schedule, p, v)
    per_device = lambda per_chunk: [sum(per_chunk[j] for j in cs) for cs in chunks]
    return per_device(sizes), per_device([f for f, _ in rec]), per_device([s for _, s in rec])


def stage_costs(model: ModelSpec, cluster: ClusterSpec, plan: Plan, kernels: LayerKernels = "fused") -> list[StageCost]:
    """Cost of each pipeline device per microbatch. TP: tp_forward all-reduces of b*s*h forward
    and tp_backward backward per layer, tp_per_full_recompute more when a layer is fully
    recomputed; the vocab-parallel embedding adds TP_EMBEDDING forward, the LM head TP_HEAD backward.

    Devices with the same work share one StageCost object (see ``unique_stages``). The
    result does not depend on d, ZeRO or offload, so it is cached across those."""
    return _stages(model, cluster, plan, kernels)[0]


def stage_groups(
    model: ModelSpec, cluster: ClusterSpec, plan: Plan, kernels: LayerKernels = "fused"
) -> list[tuple[int, StageCost, int]]:
    """(first device index, cost, number of devices) of each distinct stage. Everything that
    grows with the device index is non-increasing (in-flight microbatches; the DP slack is
    larger for later stages), so the first device of a kind bounds its time and memory."""
    return _stages(model, cluster, plan, kernels)[1]


def _stages(
    model: ModelSpec, cluster: ClusterSpec, plan: Plan, kernels: LayerKernels
) -> tuple[list[StageCost], list[tuple[int, StageCost, int]]]:
    rest = (
        plan.t,
        plan.sp,
        plan.mb,
        plan.p,
        plan.v,
        plan.ckpt,
        plan.layers,
        plan.recompute,
        plan.prec,
        plan.schedule == "zbv",
        kernels,
    )
    return _STAGES.get_or_make((model, cluster), rest, lambda: _make_stages(model, cluster, plan, kernels))


class DeviceKind(NamedTuple):
    """What a pipeline device's per-microbatch cost depends on besides the plan's layer-level
    times: its layers and recomputed layers, and whether it holds the embedding, the head and
    ZB-V's turn (chunks p-1 and p on one rank). Devices of one kind share one StageCost."""

    layers: int
    full: int
    selective: int
    first: bool
    last: bool
    turn: bool


def device_kinds(plan: Plan, num_layers: int) -> list[DeviceKind]:
    """Each pipeline device's kind (:class:`DeviceKind`), in device order."""
    ns, fulls, sels = device_layers(plan, num_layers)
    p = plan.p
    last_rank = chunk_rank(plan.schedule, p * plan.v - 1, p)
    turn_rank = p - 1 if plan.schedule == "zbv" else -1
    plain = list(map(DeviceKind, ns, fulls, sels, repeat(False, p), repeat(False, p), repeat(False, p)))
    for dev in {0, last_rank, turn_rank} - {-1}:
        plain[dev] = plain[dev]._replace(first=dev == 0, last=dev == last_rank, turn=dev == turn_rank)
    return plain


def kind_groups(kinds: list[DeviceKind]) -> list[tuple[int, DeviceKind, int]]:
    """(first device, kind, number of devices) of each distinct kind, by first device (a
    C-level scan per kind: few kinds, up to hundreds of devices)."""
    counts = Counter(kinds)
    return [(kinds.index(k), k, counts[k]) for k in dict.fromkeys(kinds)]


def _make_stages(
    model: ModelSpec, cluster: ClusterSpec, plan: Plan, kernels: LayerKernels
) -> tuple[list[StageCost], list[tuple[int, StageCost, int]]]:
    bt = block_times(model, cluster, plan.t, bool(plan.sp), plan.mb, plan.prec, kernels)
    p = plan.p
    layer_params, sharded_extra = params.layer_params_per_rank(model, plan.t), params.layer_sharded_extra(model, plan.t)
    vocab = padded_vocab_size(model, plan.t)
    tp_f, tp_l, tp_r = tp_forward(model), tp_per_layer(model), tp_per_full_recompute(model)
    a2a = experts.ALL_TO_ALLS_PER_PASS * bt.ep_all_to_all

    def cost(kind: DeviceKind) -> StageCost:  # simulator.analytic.batch._stages mirrors it over arrays
        n, full, sel, first, last, turn = kind
        fwd = n * bt.layer.forward
        bwd = n * bt.layer.backward
        bwd_w = n * bt.layer.backward_weight
        recompute = full * bt.layer.forward + sel * bt.layer.attention_core
        tp = (tp_l * n + tp_r * full) * bt.tp_all_reduce
        # a recomputed layer (full) or attention core (selective) runs its forward ring again
        cp = n * (bt.cp_forward + bt.cp_backward) + (full + sel) * bt.cp_forward
        in_forward = n * (tp_f * bt.tp_all_reduce + bt.cp_forward + a2a)
        if first:
            fwd += bt.embedding.forward
            bwd += bt.embedding.backward
            bwd_w += bt.embedding.backward_weight
            tp += TP_EMBEDDING * bt.tp_all_reduce
            in_forward += TP_EMBEDDING * bt.tp_all_reduce
        if last:
            fwd += bt.head.forward
            bwd += bt.head.backward
            bwd_w += bt.head.backward_weight
            tp += TP_HEAD * bt.tp_all_reduce
        return StageCost(
            layers=n,
            full_layers=full,
            selective_layers=sel,
            params=params.stage_params_per_rank(model, plan.t, p, n, first, last, vocab),
            first=first,
            last=last,
            forward=fwd,
            backward=bwd,
            recompute=recompute,
            tp_comm=tp,
            backward_weight=bwd_w,
            cp_comm=cp,
            weight_cast=(n + full) * bt.fp8_weight_cast,
            ep_comm=(2 * n + full) * a2a,
            sharded_extra=n * sharded_extra,  # the embedding and head hold no experts
            layer_params=n * layer_params,
            turn=turn,
            forward_comm=in_forward,
        )

    kinds = device_kinds(plan, model.num_layers)
    groups = kind_groups(kinds)
    made = {kind: cost(kind) for _, kind, _ in groups}
    return [made[k] for k in kinds], [(dev, made[kind], count) for dev, kind, count in groups]
