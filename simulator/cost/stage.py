"""Per-stage, per-microbatch costs shared by the analytic estimator and the planner.

For one pipeline device (its v chunks together) and one microbatch: forward and backward
compute time, recomputation time, TP communication time (from the layer-level times of
simulator.cost.block_times), and the memory the stage holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

from hwprofiles.schema import AttentionKernel, ClusterSpec
from simulator.cost import experts, params
from simulator.cost.block_times import (
    TP_EMBEDDING,
    TP_HEAD,
    BlockTimes,
    block_times,
    tp_forward,
    tp_per_full_recompute,
    tp_per_layer,
)
from simulator.cost.cache import IdentityCache
from simulator.cost.schedules import chunk_rank, rank_chunks
from simulator.cost.stage_memory import StageShape
from simulator.cost.workload import (
    padded_vocab_size,
)
from simulator.plan import Plan
from simulator.runtime_spec import CrossEntropy, LayerKernels
from simulator.specs import ModelSpec

_STAGES = IdentityCache(8192)


class StageSpans:
    """A stage's per-microbatch total and pass spans from its times: one formula for
    :class:`StageCost` and for the batch estimate's arrays of many plans' stages."""

    forward: Any
    backward: Any
    recompute: Any
    tp_comm: Any
    cp_comm: Any
    ep_comm: Any
    forward_comm: Any

    @property
    def total(self) -> Any:
        return self.forward + self.backward + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm

    @property
    def forward_span(self) -> Any:
        """The forward pass on the compute stream: its compute and the collectives inside it (TP,
        the cp ring, the ep all-to-alls). Data-parallel and ZeRO traffic runs beside all of it, at
        the contention price of simulator.cost.overlap (the DES's pass pieces hold the same)."""
        return self.forward + self.forward_comm

    @property
    def backward_span(self) -> Any:
        """The backward and recompute passes on the compute stream, collectives included: what
        gradient reductions and ZeRO-3 gathers hide behind (:attr:`forward_span`)."""
        return self.total - self.forward_span


@dataclass(frozen=True)
class StageCost(StageShape, StageSpans):
    """One pipeline device, one microbatch (all its chunks): its shape (layers, recomputation,
    parameters, embedding/head) and its times."""

    forward: float = 0.0  # compute, no communication
    backward: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0  # forward + backward + recompute TP collectives
    backward_weight: float = 0.0  # the weight-gradient part of backward (ZB-H1's W passes)
    cp_comm: float = 0.0  # forward + backward + recompute exposed context-parallel ring time
    # prec=fp8 without cached weight copies (simulator.runtime_spec.Runtime.fp8_weight_cache): the casts of
    # the layers' weights in every forward and full recompute; not in ``total`` (runtime-dependent)
    weight_cast: float = 0.0
    ep_comm: float = 0.0  # forward + backward + full recompute token all-to-alls (expert parallelism)
    layer_params: float = 0.0  # the parameters of its transformer layers on one rank (fp8 parameters' gathers)
    turn: bool = False  # ZB-V's last rank: its two chunks meet there, two pipeline sends fewer per microbatch
    forward_comm: float = 0.0  # the forward pass's share of tp_comm, cp_comm and ep_comm


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


def stage_costs(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    kernels: LayerKernels = "fused",
    attention: AttentionKernel = "sdpa",
    busy: float | None = None,
    loss: CrossEntropy = "fp32",
) -> list[StageCost]:
    """Cost of each pipeline device per microbatch. TP: tp_forward all-reduces of b*s*h forward
    and tp_backward backward per layer, tp_per_full_recompute more when a layer is fully
    recomputed; the vocab-parallel embedding adds TP_EMBEDDING forward, the LM head TP_HEAD backward.

    Devices with the same work share one StageCost object (see ``unique_stages``). The
    result does not depend on d, ZeRO or offload, so it is cached across those. ``kernels``,
    ``attention``: the layer's kernels and attention kernel; ``busy``: the ranks computing at once
    where they share a processor (simulator.cost.block_times.busy_ranks; None: all); ``loss``: the
    program's cross-entropy (its collectives: simulator.cost.block_comm.loss_collectives_time)."""
    return _stages(model, cluster, plan, kernels, attention, busy, loss)[0]


def stage_groups(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    kernels: LayerKernels = "fused",
    attention: AttentionKernel = "sdpa",
    busy: float | None = None,
    loss: CrossEntropy = "fp32",
) -> list[tuple[int, StageCost, int]]:
    """(first device index, cost, number of devices) of each distinct stage. Everything that
    grows with the device index is non-increasing (in-flight microbatches; the DP slack is
    larger for later stages), so the first device of a kind bounds its time and memory."""
    return _stages(model, cluster, plan, kernels, attention, busy, loss)[1]


def _stages(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    kernels: LayerKernels,
    attention: AttentionKernel,
    busy: float | None,
    loss: CrossEntropy,
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
        attention,
        busy,
        loss,
    )
    return _STAGES.get_or_make(
        (model, cluster),
        rest,
        lambda: _make_stages(
            model,
            plan,
            block_times(model, cluster, plan.t, bool(plan.sp), plan.mb, plan.prec, kernels, attention, busy, loss),
        ),
    )


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


class StageTimes(NamedTuple):
    """Seconds per microbatch of one pipeline device (all its chunks), by kind (StageCost's fields):
    numbers, or arrays in the batch estimate."""

    forward: Any
    backward: Any
    backward_weight: Any
    recompute: Any
    tp_comm: Any
    cp_comm: Any
    ep_comm: Any
    forward_comm: Any  # the forward pass's share of tp_comm, cp_comm and ep_comm
    weight_cast: Any


def stage_times(model: ModelSpec, bt: BlockTimes, n: Any, full: Any, sel: Any, first: Any, last: Any) -> StageTimes:
    """The per-microbatch times of a device of ``n`` layers (``full`` and ``sel`` of them fully and
    selectively recomputed) that holds the embedding (``first``) and the head (``last``), from
    the layer-level times ``bt`` (:func:`stage_costs`): per layer tp_forward all-reduces of b*s*h
    forward and tp_backward backward, tp_per_full_recompute more when it is fully recomputed; the
    vocab-parallel embedding adds TP_EMBEDDING forward, the LM head TP_HEAD backward and the loss
    its collectives forward (BlockTimes.loss_comm); a recomputed
    layer (full) or attention core (selective) runs its forward cp ring again; the token
    all-to-alls run in the forward, the backward and a full recompute. Numbers or arrays alike
    (the batch estimate passes the block times of each plan's (t, sp, mb, prec))."""
    ar = bt.tp_all_reduce
    a2a = experts.ALL_TO_ALLS_PER_PASS * bt.ep_all_to_all
    layer, emb, head = bt.layer, bt.embedding, bt.head
    return StageTimes(
        forward=n * layer.forward + first * emb.forward + last * head.forward,
        backward=n * layer.backward + first * emb.backward + last * head.backward,
        backward_weight=n * layer.backward_weight + first * emb.backward_weight + last * head.backward_weight,
        recompute=full * layer.forward + sel * layer.attention_core,
        tp_comm=(tp_per_layer(model) * n + tp_per_full_recompute(model) * full) * ar
        + first * TP_EMBEDDING * ar
        + last * (TP_HEAD * ar + bt.loss_comm),
        cp_comm=n * (bt.cp_forward + bt.cp_backward) + (full + sel) * bt.cp_forward,
        ep_comm=(2 * n + full) * a2a,
        forward_comm=n * (tp_forward(model) * ar + bt.cp_forward + a2a)
        + first * TP_EMBEDDING * ar
        + last * bt.loss_comm,
        weight_cast=(n + full) * bt.fp8_weight_cast,
    )


def _make_stages(
    model: ModelSpec, plan: Plan, bt: BlockTimes
) -> tuple[list[StageCost], list[tuple[int, StageCost, int]]]:
    """Each device's cost and the distinct ones (:func:`stage_groups`) from the layer-level times ``bt``."""
    p = plan.p
    layer_params, sharded_extra = params.layer_params_per_rank(model, plan.t), params.layer_sharded_extra(model, plan.t)
    vocab = padded_vocab_size(model, plan.t)

    def cost(kind: DeviceKind) -> StageCost:
        n, full, sel, first, last, turn = kind
        return StageCost(
            layers=n,
            full_layers=full,
            selective_layers=sel,
            params=params.stage_params_per_rank(model, plan.t, p, n, first, last, vocab),
            first=first,
            last=last,
            sharded_extra=n * sharded_extra,  # the embedding and head hold no experts
            layer_params=n * layer_params,
            turn=turn,
            **stage_times(model, bt, n, full, sel, first, last)._asdict(),
        )

    kinds = device_kinds(plan, model.num_layers)
    groups = kind_groups(kinds)
    made = {kind: cost(kind) for _, kind, _ in groups}
    return [made[k] for k in kinds], [(dev, made[kind], count) for dev, kind, count in groups]
