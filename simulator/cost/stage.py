"""Per-stage, per-microbatch costs shared by the analytic estimator and the planner.

For one pipeline device (its v chunks together) and one microbatch: forward and backward
compute time, recomputation time, TP communication time, and the memory the stage holds.
Layer-level times are cached per (model, GPU profile, t, sp, mb) because the search asks
for the same ones thousands of times.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives
from simulator.cost import layout
from simulator.cost import memory
from simulator.cost import params
from simulator.cost.cache import IdentityCache
from simulator.cost.ops import PassTimes, dtype_bytes, pass_times
from simulator.specs import ModelSpec, Plan
from simulator.cost.workload import (embedding_backward_extra_ops, embedding_forward_ops, head_backward_extra_ops,
                                head_forward_ops, layer_backward_extra_ops, layer_forward_ops, padded_vocab_size)


@dataclass(frozen=True)
class BlockTimes:
    """Seconds per microbatch on one TP rank: a transformer layer, the embedding, the head;
    and one TP all-reduce of the b*s*h activation (an all-gather + reduce-scatter with SP)."""

    layer: PassTimes
    embedding: PassTimes
    head: PassTimes
    tp_allreduce: float
    act_bytes: float  # b*s*h*e: one boundary activation


_BLOCKS = IdentityCache(4096)
_STAGES = IdentityCache(8192)
_ACTIVATIONS = IdentityCache(4096)
_ACT_PEAK = IdentityCache(16384)
_LAYER_PARAMS = IdentityCache(1024)


def compute_slowdown(cluster: ClusterSpec) -> float:
    """Ranks sharing a processor slow each other: max(1, ranks per node / compute slots at that
    many ranks)."""
    slots = cluster.node.slots_for(cluster.gpus_per_node)
    return max(1.0, cluster.gpus_per_node / slots) if slots else 1.0


def host_async(cluster: ClusterSpec) -> bool:
    """Does the device run asynchronously to its host? True for GPUs (NCCL nodes): the host
    enqueues kernels ahead; False for CPU ranks (gloo nodes), which execute their own ops."""
    return cluster.node.backend != "gloo"


def block_times(model: ModelSpec, cluster: ClusterSpec, t: int, sp: bool, mb: int) -> BlockTimes:
    """Per-microbatch times of a layer, the embedding and the head on one TP rank (cached).
    The head's vocabulary is Megatron's padded one (workload.padded_vocab_size)."""
    return _BLOCKS.get_or_make((model, cluster), (t, sp, mb), lambda: _block_times(model, cluster, t, sp, mb))


def _block_times(model: ModelSpec, cluster: ClusterSpec, t: int, sp: bool, mb: int) -> BlockTimes:
    gpu = cluster.gpu
    e = dtype_bytes(gpu)
    slow = compute_slowdown(cluster)
    act = mb * model.seq_length * model.hidden_size * e
    link = collectives.in_pass_link(cluster, layout.tp_shape(t, cluster.gpus_per_node))
    asy = host_async(cluster)
    vocab = padded_vocab_size(model, t)
    layer_extra = layer_backward_extra_ops(model, mb, t, sp, e, params.layer_params_per_rank(model, t))
    eager = gpu.eager
    bt = BlockTimes(
        layer=pass_times(layer_forward_ops(model, mb, t, sp, e), gpu, slow, layer_extra, asy,
                         eager.layer_us(t > 1) if eager else None),
        embedding=pass_times(embedding_forward_ops(model, mb, t, sp, e), gpu, slow,
                             embedding_backward_extra_ops(model, t, e, vocab), asy,
                             (eager.embedding_forward_us, eager.embedding_backward_us) if eager else None),
        head=pass_times(head_forward_ops(model, mb, t, sp, e, vocab), gpu, slow,
                        head_backward_extra_ops(model, t, e, vocab), asy,
                        (eager.head_forward_us, eager.head_backward_us) if eager else None),
        tp_allreduce=collectives.allreduce_time(act, t, link),
        act_bytes=act,
    )
    return bt


@dataclass(frozen=True)
class StageCost:
    """One pipeline device, one microbatch (all its chunks)."""

    forward: float      # compute, no communication
    backward: float
    recompute: float
    tp_comm: float      # forward + backward + recompute TP collectives
    layers: int
    full_layers: int
    selective_layers: int
    params: float       # parameters held by one rank of this stage (before ZeRO sharding)
    first: bool
    last: bool

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute + self.tp_comm


def device_chunks(plan: Plan, num_layers: int) -> list[list[int]]:
    """Chunk indices (model order) on each pipeline device: chunk c lives on device c % p."""
    chunks = plan.p * plan.v
    return [list(range(dev, chunks, plan.p)) for dev in range(plan.p)]



def stage_costs(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> list[StageCost]:
    """Cost of each pipeline device per microbatch. TP: 2 all-reduces of b*s*h forward and 2
    backward per layer, 2 more when a layer is fully recomputed (Narayanan et al. 2021, 3.2);
    the vocab-parallel embedding adds one forward all-reduce, the LM head one backward.

    Devices with the same work share one StageCost object (see ``unique_stages``). The
    result does not depend on d, ZeRO or offload, so it is cached across those."""
    return _stages(model, cluster, plan)[0]


def stage_groups(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> list[tuple[int, StageCost, int]]:
    """(first device index, cost, number of devices) of each distinct stage. Everything that
    grows with the device index is non-increasing (in-flight microbatches; the DP slack is
    larger for later stages), so the first device of a kind bounds its time and memory."""
    return _stages(model, cluster, plan)[1]


def _stages(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> tuple[list[StageCost], list[tuple[int, StageCost, int]]]:
    rest = (plan.t, plan.sp, plan.mb, plan.p, plan.v, plan.ckpt, plan.layers, plan.recompute)
    return _STAGES.get_or_make((model, cluster), rest, lambda: _make_stages(model, cluster, plan))


def _make_stages(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> tuple[list[StageCost], list[tuple[int, StageCost, int]]]:
    bt = block_times(model, cluster, plan.t, bool(plan.sp), plan.mb)
    sizes = plan.chunk_layers(model.num_layers)
    rec = plan.chunk_recompute(model.num_layers)
    last_chunk = len(sizes) - 1
    out: list[StageCost] = []
    made: dict[tuple, StageCost] = {}
    groups: dict[tuple, list] = {}
    for dev, chunk_ids in enumerate(device_chunks(plan, model.num_layers)):
        n = sum(sizes[c] for c in chunk_ids)
        full = sum(rec[c][0] for c in chunk_ids)
        sel = sum(rec[c][1] for c in chunk_ids)
        first, last = 0 in chunk_ids, last_chunk in chunk_ids
        sig = (n, full, sel, first, last)
        if sig in made:
            out.append(made[sig])
            groups[sig][2] += 1
            continue
        fwd = n * bt.layer.forward
        bwd = n * bt.layer.backward
        recompute = full * bt.layer.forward + sel * bt.layer.attention_core
        tp = (4 * n + 2 * full) * bt.tp_allreduce
        if first:
            fwd += bt.embedding.forward
            bwd += bt.embedding.backward
            tp += bt.tp_allreduce
        if last:
            fwd += bt.head.forward
            bwd += bt.head.backward
            tp += bt.tp_allreduce
        psi = params.stage_params_per_rank(model, plan.t, plan.p, n, first, last, padded_vocab_size(model, plan.t))
        made[sig] = StageCost(fwd, bwd, recompute, tp, n, full, sel, psi, first, last)
        out.append(made[sig])
        groups[sig] = [dev, made[sig], 1]
    uniq = [tuple(g) for g in groups.values()]
    return out, uniq


def _layer_activations(model: ModelSpec, b: int, t: int, sp: bool, e: int) -> tuple[float, float, float]:
    return _ACTIVATIONS.get_or_make((model,), (b, t, sp, e), lambda: tuple(
        memory.activation_bytes_per_layer(model, b, t, sp, mode, e) for mode in ("full", "selective", "none")))


@dataclass(frozen=True)
class StageMemory:
    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers


def stage_memory(model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, stage: int, cost: StageCost) -> StageMemory:
    """Peak memory of one rank of pipeline device ``stage`` (DESIGN.md section 4, "Memory").

    activations = in-flight microbatches * sum over its layers of the per-layer activation
    for that layer's recompute mode, plus one layer's full activations while it is
    recomputed (or, without recomputation, while its backward runs);
    buffers = gradient buckets, ZeRO-3 gathered layers, the last stage's logits (one per
    in-flight microbatch: the saved cross-entropy softmax), and the pipeline buffers.
    GPipe does not recompute the last microbatch (its backward follows its forward at once),
    so with recomputation that microbatch keeps its layers' full activations."""
    e = dtype_bytes(cluster.gpu)
    pb, gb, k = memory.state_bytes_per_param(e)
    states = memory.model_state_bytes(cost.params, plan.d, plan.zero, plan.offload, pb, gb, k)
    # the activations do not depend on d, ZeRO or offload: shared by those variants
    act = _ACT_PEAK.get_or_make((cost, model, cluster), (plan.schedule, stage, m, plan.v, plan.layers, plan.recompute, plan.sp),
                                lambda: _activation_peak(model, cluster, plan, m, stage, cost))
    b, t = plan.mb, plan.t
    s, h = model.seq_length, model.hidden_size
    inflight = memory.in_flight_microbatches(plan.schedule, stage, plan.p, m, plan.v)
    buffers = memory.gradient_bucket_bytes(cost.params) if plan.d > 1 or plan.offload != "none" else 0.0
    if plan.zero == 3:
        buffers += memory.zero3_working_set_bytes(_LAYER_PARAMS.get_or_make((model,), t, lambda: params.layer_params_per_rank(model, t)))
    if cost.last:
        buffers += inflight * memory.logits_buffer_bytes(model, b, t, e, padded_vocab_size(model, t))
    buffers += memory.pipeline_buffer_bytes(b, s, h, e, plan.p)
    return StageMemory(states.params, states.grads, states.optimizer, act, buffers)


def _activation_peak(model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, stage: int, cost: StageCost) -> float:
    """Activation bytes of one rank of device ``stage`` at its peak (see stage_memory)."""
    e = dtype_bytes(cluster.gpu)
    sp, b, t = bool(plan.sp), plan.mb, plan.t
    per_full, per_sel, per_none = _layer_activations(model, b, t, sp, e)
    inflight = memory.in_flight_microbatches(plan.schedule, stage, plan.p, m, plan.v)
    if plan.v == 1 or (plan.layers is None and plan.recompute is None):  # equal chunks
        none_layers = cost.layers - cost.full_layers - cost.selective_layers
        act = inflight * (cost.full_layers * per_full + cost.selective_layers * per_sel + none_layers * per_none)
    else:  # chunks of the device may differ: the schedule's worst per-chunk occupancy
        sizes, rec = plan.chunk_layers(model.num_layers), plan.chunk_recompute(model.num_layers)
        held = [f * per_full + s_ * per_sel + (n - f - s_) * per_none
                for (f, s_), n in ((rec[c], sizes[c]) for c in range(stage, plan.p * plan.v, plan.p))]
        act = max(sum(k * x for k, x in zip(vec, held))
                  for vec in memory.chunk_occupancy(plan.schedule, stage, plan.p, m, plan.v))
    act += per_none if cost.full_layers else 0.0
    if plan.schedule == "gpipe" and m > 1:
        act += cost.full_layers * (per_none - per_full) + cost.selective_layers * (per_none - per_sel)
    if cost.first:
        act += inflight * memory.embedding_activation_bytes(b, model.seq_length, model.hidden_size, t, sp)
    return act
