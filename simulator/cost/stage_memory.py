"""The stage memory model: peak bytes of one rank of a pipeline device (docs/design.md section 4, "Memory").

One model, in two forms that agree (tests/test_stage_memory.py):

* :func:`stage_memory` -- the analytic estimate's breakdown of a device's peak (params, grads,
  optimizer, activations, buffers) for a plan's layer split and recomputation;
* :class:`DeviceMemoryModel` -- the same bytes as a linear function of the device's per-chunk
  layer counts n_c, fully recomputed layers f_c and selectively recomputed layers s_c, for the
  CP-SAT partitioner (autoplan.partition), one expression per reachable occupancy vector k:

      mem = fixed + a_none * [any f_c > 0]
            + sum_c [ (states_layer + k_c a_none + w) n_c + k_c (a_full - a_none) f_c + k_c (a_sel - a_none) s_c ]
            + gpipe * sum_c [ (a_none - a_full) f_c + (a_none - a_sel) s_c ]

  where ``gpipe`` is 1 for GPipe with m > 1 (its last microbatch is not recomputed, so it
  keeps its layers' full activations) and ``w`` the inputs ZB-H1's deferred weight gradients keep
  per layer (0 for the other schedules). The gradient buckets depend on the stage's parameter
  count, min(2 * bucket, psi * grad bytes); the linear form takes their cap, so it is the
  exact peak once a stage's gradients exceed two buckets and an upper bound below that.

Terms (all per rank of the device):
    states      = model_state_bytes(psi) (ZeRO 0-3, offload; simulator.cost.memory), psi the
                  stage's parameters with Megatron's padded vocabulary;
    activations = occupancy-weighted per-layer activations for each layer's recompute mode,
                  plus one layer's full activations while it is recomputed (or, without
                  recomputation, while its backward runs), plus on the first stage the
                  embedding dropout mask per in-flight microbatch;
    buffers     = gradient buckets (d > 1 or offload), ZeRO-3 gathered layers, the last
                  stage's logits per in-flight microbatch (the saved cross-entropy softmax)
                  and its loss backward's gradients, the pipeline send/receive buffers, and
                  the program's compute-dtype weight copies (autocast; simulator.job.Runtime) and
                  the fp8 weight copies of prec=fp8 (simulator.cost.precision).
                  The linear form prices the default runtime's (Megatron-style) buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwprofiles.schema import ClusterSpec
from simulator.cost import memory, params
from simulator.cost.cache import IdentityCache
from simulator.cost.ops import dtype_bytes
from simulator.cost.precision import fp8_layer_bytes, fp8_shard_bytes, fp8_weight_bytes, linear_input_bytes
from simulator.cost.schedules import rank_chunks
from simulator.cost.workload import padded_vocab_size
from simulator.plan import Plan
from simulator.specs import ModelSpec

_ACTIVATIONS = IdentityCache(4096)
_ACT_PEAK = IdentityCache(16384)


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


@dataclass(frozen=True)
class StageShape:
    """What the memory of one pipeline device depends on besides the plan: its layers and their
    recomputation, and whether it holds the embedding (first) and the head (last)."""

    layers: int
    full_layers: int
    selective_layers: int
    params: float  # parameters held by one rank of the device (before ZeRO sharding)
    first: bool
    last: bool
    # parameters beyond ``params`` whose sharded states the rank keeps a share of: with expert
    # parallelism, the experts of the other ep ranks (each E/ep experts' states are sharded over
    # d/ep ranks, so a rank holds as much as if all E were sharded over d: simulator.cost.rank_view)
    sharded_extra: float = 0.0

    @property
    def sharded_params(self) -> float:
        """The parameters whose states ZeRO shards over the shard group."""
        return self.params + self.sharded_extra


def layer_activations(
    model: ModelSpec, b: int, t: int, sp: bool, e: int, prec: str = "bf16"
) -> tuple[float, float, float]:
    """(full, selective, none): one layer's activations per microbatch by recompute mode, fp8
    linears saving 1-byte inputs under ``prec`` fp8 (cached)."""
    li = linear_input_bytes(prec, e)
    return _ACTIVATIONS.get_or_make(
        (model,),
        (b, t, sp, e, li),
        lambda: tuple(
            memory.activation_bytes_per_layer(model, b, t, sp, mode, e, li) for mode in ("full", "selective", "none")
        ),
    )


def fp8_weight_copies(model: ModelSpec, plan: Plan, layers: int, e: int) -> float:
    """What prec=fp8 adds to the memory of a rank holding ``layers`` layers: the fp8 weight
    copies, or with fp8 parameters their difference (simulator.cost.precision.fp8_weight_bytes)."""
    return fp8_weight_bytes(plan, layers, params.layer_params_per_rank(model, plan.t), e)


def stage_buffers(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    m: int,
    stage: int,
    last: bool,
    psi: float | None,
    loss: memory.CrossEntropy = "fp32",
) -> float:
    """Buffers of one rank of device ``stage`` (module docstring): :func:`sharding_buffers` +
    :func:`flight_buffers`."""
    return sharding_buffers(model, plan, psi) + flight_buffers(model, cluster, plan, m, stage, last, loss)


def weight_copies_held(weight_copy_bytes: float, stage_params: float) -> float:
    """The program's compute-dtype weight copies at the stage's peak (simulator.job.Runtime.
    weight_copy_bytes per parameter of the stage). Autocast caches a weight's bf16 copy until
    its context exits: autoplan's program holds one context over the whole pipeline schedule
    (p > 1) and, without a pipeline, one over each microbatch's forward, at whose end every
    copy is alive beside the checkpoints and the logits; without recomputation the matmuls keep
    them for backward anyway. Measured on an H100 (benchmarks/data/h100-memory-probe.txt): 2.0
    bytes per parameter held after an autocast forward, and at its end with recomputation too.
    The embedding table, which autocast does not cast, is counted as well: V*h*weight_copy_bytes
    too many on a first stage that does not also hold the tied head."""
    return weight_copy_bytes * stage_params


def sharding_buffers(model: ModelSpec, plan: Plan, psi: float | None) -> float:
    """The buffers that data parallelism, ZeRO and offload add: gradient buckets (d > 1 or
    offload; ``psi`` None: at their cap, the linear form) and ZeRO-3's gathered layers."""
    out = 0.0
    if plan.d > 1 or plan.offload != "none":
        out += memory.gradient_bucket_bytes(float("inf") if psi is None else psi)
    if plan.zero == 3:
        out += memory.zero3_working_set_bytes(params.layer_params_per_rank(model, plan.t))
    return out


def flight_buffers(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    m: int,
    stage: int,
    last: bool,
    loss: memory.CrossEntropy = "fp32",
) -> float:
    """The buffers the pipeline schedule fixes: the last stage's logits per in-flight microbatch
    (``loss``: how the program computes the cross-entropy, simulator.job.Runtime.cross_entropy)
    and the pipeline send/receive buffers."""
    e = dtype_bytes(cluster.gpu)
    b, t = plan.mb, plan.t
    out = 0.0
    if last:
        inflight = memory.end_chunk_in_flight(plan.schedule, stage, plan.p, m, plan.v, plan.v - 1)
        out += memory.logits_buffer_bytes(model, b, t, e, padded_vocab_size(model, t), loss, inflight)
    return out + memory.pipeline_buffer_bytes(b, model.seq_length, model.hidden_size, e, plan.p)


def stage_memory(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    m: int,
    stage: int,
    shape: StageShape,
    loss: memory.CrossEntropy = "fp32",
    weight_copy_bytes: float = 0.0,
    state_layout: memory.StateLayout = "mixed",
) -> StageMemory:
    """Peak memory of one rank of pipeline device ``stage`` (module docstring); ``loss``,
    ``weight_copy_bytes`` and ``state_layout``: the program's (simulator.job.Runtime)."""
    e = dtype_bytes(cluster.gpu)
    pb, gb, k = memory.program_state_bytes(state_layout, e, plan.zero)
    states = memory.model_state_bytes(
        shape.params, plan.shard_group, plan.zero, plan.offload, pb, gb, k, shape.sharded_params
    )
    act = activation_peak(model, cluster, plan, m, stage, shape)
    buffers = stage_buffers(model, cluster, plan, m, stage, shape.last, shape.params, loss)
    buffers += weight_copies_held(weight_copy_bytes, shape.params) + fp8_weight_copies(model, plan, shape.layers, e)
    return StageMemory(states.params, states.grads, states.optimizer, act, buffers)


def activation_peak(model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, stage: int, shape: StageShape) -> float:
    """Activation bytes of one rank of device ``stage`` at its peak (module docstring). They do
    not depend on d, ZeRO or offload: cached across those variants."""
    return _ACT_PEAK.get_or_make(
        (shape, model, cluster),
        (plan.schedule, stage, m, plan.v, plan.layers, plan.recompute, plan.sp, plan.mb, plan.t, plan.prec),
        lambda: _activation_peak(model, cluster, plan, m, stage, shape),
    )


def _activation_peak(
    model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, stage: int, shape: StageShape
) -> float:
    e = dtype_bytes(cluster.gpu)
    sp, b, t = bool(plan.sp), plan.mb, plan.t
    per_full, per_sel, per_none = layer_activations(model, b, t, sp, e, plan.prec)
    inflight = memory.in_flight_microbatches(plan.schedule, stage, plan.p, m, plan.v)
    if plan.v == 1 or (plan.layers is None and plan.recompute is None):  # equal chunks
        none_layers = shape.layers - shape.full_layers - shape.selective_layers
        act = inflight * (shape.full_layers * per_full + shape.selective_layers * per_sel + none_layers * per_none)
    else:  # chunks of the device may differ: the schedule's worst per-chunk occupancy
        sizes, rec = plan.chunk_layers(model.num_layers), plan.chunk_recompute(model.num_layers)
        held = [
            f * per_full + s_ * per_sel + (n - f - s_) * per_none
            for (f, s_), n in ((rec[c], sizes[c]) for c in rank_chunks(plan.schedule, plan.p, plan.v)[stage])
        ]
        act = max(
            sum(k * x for k, x in zip(vec, held))
            for vec in memory.chunk_occupancy(plan.schedule, stage, plan.p, m, plan.v)
        )
    act += per_none if shape.full_layers else 0.0
    if plan.schedule == "gpipe" and m > 1:
        act += shape.full_layers * (per_none - per_full) + shape.selective_layers * (per_none - per_sel)
    act += pending_weight_inputs(model, cluster, plan, m, stage) * shape.layers
    if shape.first:
        emb = memory.end_chunk_in_flight(plan.schedule, stage, plan.p, m, plan.v, 0)
        act += emb * memory.embedding_activation_bytes(b, model.seq_length, model.hidden_size, t, sp)
    return act


def pending_weight_inputs(model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, stage: int) -> float:
    """Bytes per layer that ZB-H1's deferred weight-gradient passes keep at the stage's peak: the
    linears' inputs of each microbatch still owing its W (memory.weight_grads_pending); 0 for the
    other schedules."""
    pending = memory.weight_grads_pending(plan.schedule, stage, plan.p, m)
    if not pending:
        return 0.0
    e = dtype_bytes(cluster.gpu)
    li = linear_input_bytes(plan.prec, e)
    return pending * memory.weight_grad_input_bytes(model, plan.mb, plan.t, bool(plan.sp), li)


@dataclass(frozen=True)
class DeviceMemoryModel:
    """The linear form of :func:`stage_memory` for one device (module docstring)."""

    fixed: float  # bytes that do not scale with the device's layers
    layer_states: float  # model states of one layer
    a_full: float
    a_sel: float
    a_none: float
    occupancy: tuple[tuple[int, ...], ...]  # reachable per-chunk in-flight counts (memory.chunk_occupancy)
    gpipe_last_kept: bool  # GPipe, m > 1: the last microbatch keeps full activations
    pending_w: float = 0.0  # ZB-H1: bytes per layer of the deferred weight gradients' inputs

    @staticmethod
    def of(
        model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, stage: int, first: bool, last: bool
    ) -> DeviceMemoryModel:
        e = dtype_bytes(cluster.gpu)
        pb, gb, k = memory.state_bytes_per_param(e)
        a_full, a_sel, a_none = layer_activations(model, plan.mb, plan.t, bool(plan.sp), e, plan.prec)
        psi_layer = params.layer_params_per_rank(model, plan.t)
        layer_states = memory.model_state_bytes(
            psi_layer,
            plan.shard_group,
            plan.zero,
            plan.offload,
            pb,
            gb,
            k,
            psi_layer + params.layer_sharded_extra(model, plan.t),
        ).total
        if plan.zero != 3:  # fp8 weight copies per layer (ZeRO-3: the working set's, in fixed)
            layer_states += fp8_layer_bytes(plan, psi_layer, e)
        layer_states += fp8_shard_bytes(plan, psi_layer, e)  # fp8 parameters' ZeRO-3 shards
        psi = params.stage_params_per_rank(model, plan.t, plan.p, 0, first, last, padded_vocab_size(model, plan.t))
        fixed = memory.model_state_bytes(psi, plan.shard_group, plan.zero, plan.offload, pb, gb, k).total
        fixed += stage_buffers(model, cluster, plan, m, stage, last, None)
        if plan.zero == 3:
            fixed += memory.ZERO3_LAYERS_HELD * fp8_layer_bytes(plan, psi_layer, e)
        if first:
            inflight = memory.end_chunk_in_flight(plan.schedule, stage, plan.p, m, plan.v, 0)
            fixed += inflight * memory.embedding_activation_bytes(
                plan.mb, model.seq_length, model.hidden_size, plan.t, bool(plan.sp)
            )
        occupancy = memory.chunk_occupancy(plan.schedule, stage, plan.p, m, plan.v)
        return DeviceMemoryModel(
            fixed,
            layer_states,
            a_full,
            a_sel,
            a_none,
            occupancy,
            plan.schedule == "gpipe" and m > 1,
            pending_weight_inputs(model, cluster, plan, m, stage),
        )

    def coefficients(self, vec: tuple[int, ...]) -> list[tuple[float, float, float]]:
        """Per chunk of the device, the bytes per unit of (n_c, f_c, s_c) under occupancy ``vec``."""
        g = 1.0 if self.gpipe_last_kept else 0.0
        return [
            (
                self.layer_states + k * self.a_none + self.pending_w,
                k * (self.a_full - self.a_none) + g * (self.a_none - self.a_full),
                k * (self.a_sel - self.a_none) + g * (self.a_none - self.a_sel),
            )
            for k in vec
        ]

    def bytes(self, n: list[int], f: list[int], s: list[int]) -> float:
        """The peak for the device's chunks' (n, f, s), in local chunk order."""
        worst = max(
            sum(cn * nc + cf * fc + cs * sc for (cn, cf, cs), nc, fc, sc in zip(self.coefficients(vec), n, f, s))
            for vec in self.occupancy
        )
        return self.fixed + (self.a_none if any(f) else 0.0) + worst
