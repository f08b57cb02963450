"""The stage memory model: peak bytes of one rank of a pipeline device (docs/design.md section 4, "Memory").

One model, in two forms that agree (tests/test_stage_memory.py):

* :func:`stage_memory` -- the analytic estimate's breakdown of a device's peak (params, grads,
  optimizer, activations, buffers) for a plan's layer split and recomputation;
* :class:`~simulator.cost.stage_memory_linear.DeviceMemoryModel` -- the same bytes as a linear
  function of the device's per-chunk layer counts, for the CP-SAT partitioner.

Each term is a rule over numbers or arrays alike (simulator.numeric): the batch estimate
(simulator.analytic.batch) calls the same functions for many plans' stages.

Terms (all per rank of the device):
    states      = model_state_bytes(psi) (ZeRO 0-3, offload), psi the stage's padded-vocabulary parameters;
    activations = occupancy-weighted per-layer activations for each layer's recompute mode,
                  plus on the first stage the embedding dropout mask per in-flight microbatch;
    buffers     = gradient buckets (d > 1 or offload), ZeRO-3 gathered layers, the last
                  stage's logits per in-flight microbatch (the saved cross-entropy softmax),
                  the pipeline send/receive buffers and the fp8 weight copies of prec=fp8
                  (simulator.cost.precision);
    transient   = what one phase of the step holds besides, the largest of three
                  (:func:`phase_transient`): the forward's end (the program's compute-dtype
                  weight copies, simulator.runtime_spec.Runtime.weight_copy_bytes, and the loss
                  forward's fp32 logits), the loss backward (its gradients) and a fully
                  recomputed layer's recompute (that layer's full activations), the last two
                  with the weight copies the backward still holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hwprofiles.schema import ClusterSpec
from simulator.cost import memory, params, state_bytes
from simulator.cost.boundary import pipeline_buffer_bytes
from simulator.cost.cache import IdentityCache
from simulator.cost.eager_layer import eager_activation_bytes
from simulator.cost.fsdp2_sync import plan_deferred_sync, whole_grad_bytes, zero2_unsharded_bytes, zero3_gathered_bytes
from simulator.cost.ops import dtype_bytes
from simulator.cost.phase_memory import (
    gradients_late,
    phase_transient,
    recompute_working_set,
    weight_copies_held,
    weight_copies_saved,
)
from simulator.cost.precision import fp8_weight_bytes, linear_input_bytes
from simulator.cost.schedules import rank_chunks
from simulator.cost.workload import padded_vocab_size
from simulator.numeric import any_of, where
from simulator.plan import Plan
from simulator.runtime_spec import EAGER, OVERLAPPED, CrossEntropy, LayerKernels, Runtime
from simulator.specs import ModelSpec

_ACTIVATIONS = IdentityCache(4096)
_ACT_PEAK = IdentityCache(16384)


@dataclass(frozen=True)
class StageMemory:
    """Bytes of one rank of a pipeline device at its peak, by kind: numbers, or arrays (plans x
    stages) in the batch estimate."""

    params: Any
    grads: Any
    optimizer: Any
    activations: Any
    buffers: Any

    @property
    def total(self) -> Any:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers


class StageLike(Protocol):
    """What the rules read of a pipeline stage: simulator.cost.stage.StageCost for one plan, the
    batch estimate's StageArrays (an array per field, plans x stages) for many."""

    @property
    def layers(self) -> Any: ...
    @property
    def full_layers(self) -> Any: ...
    @property
    def first(self) -> Any: ...
    @property
    def last(self) -> Any: ...
    @property
    def params(self) -> Any: ...
    @property
    def layer_params(self) -> Any: ...  # its transformer layers' parameters on one rank
    @property
    def forward(self) -> Any: ...
    @property
    def backward(self) -> Any: ...
    @property
    def recompute(self) -> Any: ...
    @property
    def forward_span(self) -> Any: ...
    @property
    def backward_span(self) -> Any: ...


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
    model: ModelSpec, b: int, t: int, sp: bool, e: int, prec: str = "bf16", kernels: LayerKernels = "fused"
) -> tuple[float, float, float]:
    """(full, selective, none): one layer's activations per microbatch by recompute mode, fp8
    linears saving 1-byte inputs under ``prec`` fp8, and what the eager program keeps beyond the
    fused layer's under ``kernels`` "eager" (simulator.cost.eager_layer.eager_activation_bytes;
    Runtime.layer_kernels) (cached)."""
    li = linear_input_bytes(prec, e)
    eager = kernels == EAGER

    def per_mode(mode: str) -> float:
        extra = eager_activation_bytes(model, b, t, sp, mode, e) if eager else 0.0
        return memory.activation_bytes_per_layer(model, b, t, sp, mode, e, li) + extra

    return _ACTIVATIONS.get_or_make(
        (model,), (b, t, sp, e, li, eager), lambda: tuple(per_mode(mode) for mode in ("full", "selective", "none"))
    )


def fp8_weight_copies(model: ModelSpec, plan: Plan, layers: int, e: int) -> float:
    """What prec=fp8 adds to the memory of a rank holding ``layers`` layers: the fp8 weight
    copies, or with fp8 parameters their difference (simulator.cost.precision.fp8_weight_bytes)."""
    return fp8_weight_bytes(plan, layers, params.layer_params_per_rank(model, plan.t), e)


def sharding_buffers(
    model: ModelSpec,
    plan: Plan,
    e: int,
    psi: float | None,
    bucket_bytes: float = memory.DP_BUCKET_BYTES,
    every_bucket: bool = False,
    grad_bytes: int = state_bytes.GRAD_BYTES,
    deferred: bool = False,
) -> float:
    """The buffers data parallelism, ZeRO and offload add (:func:`sharding_buffer_bytes`) to a rank of ``psi``
    parameters (None, the linear form's: buckets at their cap, a ``deferred`` sync's gathers added per parameter)."""
    working_set = memory.zero3_working_set_bytes(params.layer_params_per_rank(model, plan.t), e)
    buckets = plan.d > 1 or plan.offload != "none"
    psi_ = float("inf") if psi is None else psi
    gathered = zero3_gathered_bytes(working_set, 0.0 if psi is None else psi, deferred, e)
    return sharding_buffer_bytes(psi_, buckets, plan.zero == 3, gathered, bucket_bytes, every_bucket, grad_bytes)


def sharding_buffer_bytes(
    psi: Any,
    buckets: Any,
    zero3: Any,
    working_set: Any,
    bucket_bytes: Any = memory.DP_BUCKET_BYTES,
    every_bucket: Any = False,
    grad_bytes: Any = state_bytes.GRAD_BYTES,
) -> Any:
    """Gradient buckets of ``bucket_bytes`` (``buckets``: d > 1 or offload;
    simulator.cost.memory.gradient_bucket_bytes of the ``psi`` parameters, ``every_bucket`` and
    ``grad_bytes`` as there) and ZeRO-3's gathered layers (``working_set``, with ``zero3``).
    Numbers or arrays alike."""
    held = memory.gradient_bucket_bytes(psi, bucket_bytes, grad_bytes, every_bucket)
    return where(buckets, held, 0.0) + where(zero3, working_set, 0.0)


def flight_buffers(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    m: int,
    stage: int,
    last: bool,
    loss: CrossEntropy = "fp32",
) -> float:
    """The buffers the pipeline schedule fixes: the last stage's logits per in-flight microbatch
    (``loss``: how the program computes the cross-entropy, simulator.runtime_spec.Runtime.cross_entropy)
    and the pipeline send/receive buffers (:func:`flight_buffer_bytes`)."""
    e = dtype_bytes(cluster.gpu)
    b, t = plan.mb, plan.t
    inflight = memory.end_chunk_in_flight(plan.schedule, stage, plan.p, m, plan.v, plan.v - 1) if last else 0.0
    logits = memory.logits_elements(model, b, t, padded_vocab_size(model, t), loss)
    pipe = pipeline_buffer_bytes(model, b, e, plan.p)
    return flight_buffer_bytes(last, logits, inflight, loss, e, pipe)


def flight_buffer_bytes(last: Any, logits: Any, inflight: Any, loss: CrossEntropy, e: int, pipe: Any) -> Any:
    """On the last stage (``last``) what it keeps of the ``logits`` elements of ``inflight``
    microbatches in flight (simulator.cost.memory.kept_logits_bytes), plus the ``pipe`` bytes of
    pipeline buffers. Numbers or arrays alike."""
    return where(last, memory.kept_logits_bytes(logits, loss, e, inflight), 0.0) + pipe


def stage_memory(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    m: int,
    stage: int,
    shape: StageShape,
    runtime: Runtime = OVERLAPPED,
) -> StageMemory:
    """Peak memory of one rank of pipeline device ``stage`` (module docstring) as ``runtime`` runs
    it (simulator.runtime_spec.Runtime: its loss, state layout, weight copies, layer kernels,
    gradient buckets and when its gradients exist)."""
    e = dtype_bytes(cluster.gpu)
    pb, gb, k = state_bytes.program_state_bytes(runtime.states, e, plan.zero, runtime.scatter_gather)
    deferred = plan_deferred_sync(plan, runtime)
    whole, unsharded = whole_grad_bytes(deferred, runtime, e), zero2_unsharded_bytes(plan.d, plan.zero, runtime, e)
    states = memory.model_state_bytes(
        shape.params, plan.shard_group, plan.zero, plan.offload, pb, gb, k, shape.sharded_params, whole, unsharded
    )
    loss, kernels = runtime.loss(plan.t), runtime.layer_kernels
    buckets = memory.bucket_bytes_of(runtime, plan.d)
    return stage_peak(
        states,
        activation_peak(model, cluster, plan, m, stage, shape, kernels),
        sharding_buffers(model, plan, e, shape.params, buckets, runtime.dp_buckets == "all", gb, deferred),
        flight_buffers(model, cluster, plan, m, stage, shape.last, loss),
        fp8_weight_copies(model, plan, shape.layers, e),
        stage_transient(model, cluster, plan, shape, loss, runtime.weight_copy_bytes, kernels),
        gradients_late(runtime.grads_freed, m, plan.p, plan.d, plan.zero),
    )


def stage_transient(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    shape: StageShape,
    loss: CrossEntropy,
    weight_copy_bytes: float,
    kernels: LayerKernels,
) -> tuple[float, float]:
    """:func:`phase_transient` of one rank of a device shaped ``shape``."""
    e = dtype_bytes(cluster.gpu)
    b, t = plan.mb, plan.t
    per_none = layer_activations(model, b, t, bool(plan.sp), e, plan.prec, kernels)[2]
    full_params = shape.full_layers * params.layer_params_per_rank(model, t)
    logits = memory.logits_elements(model, b, t, padded_vocab_size(model, t), loss) if shape.last else 0.0
    return phase_transient(
        weight_copies_held(weight_copy_bytes, shape.params),
        weight_copies_saved(weight_copy_bytes, shape.params, full_params, plan.p > 1),
        *memory.loss_transient_bytes(logits, loss, e),
        recompute_working_set(shape.full_layers, per_none),
    )


def stage_peak(
    states: memory.ModelStates,
    activations: Any,
    sharding: Any,
    flight: Any,
    fp8_copies: Any,
    transient: tuple[Any, Any],
    late_grads: Any = False,
) -> StageMemory:
    """A stage's peak from its terms (module docstring): the model states, the lasting activations
    and buffers (sharding, in-flight, fp8 copies), and the ``transient`` (activations, buffers)
    of its largest phase (:func:`phase_transient`). With ``late_grads`` (:func:`gradients_late`)
    the gradients and what the microbatch holds never meet: the peak is the larger of the two
    (the backward's end holds every gradient, the activations and the loss's logits freed).
    Numbers or arrays alike; with no ``late_grads`` anywhere, the comparison is not made (most
    of a search's plans: :func:`gradients_late` needs p = d = m = 1)."""
    act = activations + transient[0]
    held = flight + transient[1]
    if not any_of(late_grads):
        return StageMemory(states.params, states.grads, states.optimizer, act, (sharding + fp8_copies) + held)
    grads_win = late_grads & (states.grads >= act + held)
    grads = where(late_grads & ~grads_win, 0.0, states.grads)
    buffers = (sharding + fp8_copies) + where(grads_win, 0.0, held)
    return StageMemory(states.params, grads, states.optimizer, where(grads_win, 0.0, act), buffers)


def activation_peak(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    m: int,
    stage: int,
    shape: StageShape,
    kernels: LayerKernels = "fused",
) -> float:
    """Activation bytes of one rank of device ``stage`` at its peak (module docstring), the
    layers running ``kernels`` (:func:`layer_activations`). They do not depend on d, ZeRO or
    offload: cached across those variants."""
    return _ACT_PEAK.get_or_make(
        (shape, model, cluster),
        (plan.schedule, stage, m, plan.v, plan.layers, plan.recompute, plan.sp, plan.mb, plan.t, plan.prec, kernels),
        lambda: _activation_peak(model, cluster, plan, m, stage, shape, kernels),
    )


def _activation_peak(
    model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, stage: int, shape: StageShape, kernels: LayerKernels
) -> float:
    e = dtype_bytes(cluster.gpu)
    sp, b, t = bool(plan.sp), plan.mb, plan.t
    per_layer = layer_activations(model, b, t, sp, e, plan.prec, kernels)
    if plan.v == 1 or (plan.layers is None and plan.recompute is None):  # equal chunks
        inflight = memory.in_flight_microbatches(plan.schedule, stage, plan.p, m, plan.v)
        occupied = held_activations(inflight, shape.layers, shape.full_layers, shape.selective_layers, *per_layer)
    else:  # chunks of the device may differ: the schedule's worst per-chunk occupancy
        sizes, rec = plan.chunk_layers(model.num_layers), plan.chunk_recompute(model.num_layers)
        held = [
            held_activations(1, n, f, s_, *per_layer)
            for (f, s_), n in ((rec[c], sizes[c]) for c in rank_chunks(plan.schedule, plan.p, plan.v)[stage])
        ]
        occupied = max(
            sum(k * x for k, x in zip(vec, held))
            for vec in memory.chunk_occupancy(plan.schedule, stage, plan.p, m, plan.v)
        )
    emb_inflight = memory.end_chunk_in_flight(plan.schedule, stage, plan.p, m, plan.v, 0) if shape.first else 0.0
    return activation_bytes(
        occupied,
        shape.layers,
        shape.full_layers,
        shape.selective_layers,
        per_layer,
        plan.schedule == "gpipe" and m > 1,
        pending_weight_inputs(model, cluster, plan, m, stage),
        shape.first,
        emb_inflight * memory.embedding_activation_bytes(b, model.seq_length, model.hidden_size, t, sp),
    )


def held_activations(
    inflight: Any, layers: Any, full: Any, sel: Any, per_full: Any, per_sel: Any, per_none: Any
) -> Any:
    """The activations ``inflight`` microbatches keep of ``layers`` layers of which ``full`` and
    ``sel`` are fully and selectively recomputed, at (``per_full``, ``per_sel``, ``per_none``)
    bytes per layer and microbatch (:func:`layer_activations`). Numbers or arrays alike."""
    return inflight * (full * per_full + sel * per_sel + (layers - full - sel) * per_none)


def activation_bytes(
    occupied: Any,
    layers: Any,
    full: Any,
    sel: Any,
    per_layer: tuple[Any, Any, Any],
    gpipe_kept: Any,
    pending_per_layer: Any,
    first: Any,
    embedding: Any,
) -> Any:
    """A device's lasting activations at its peak (module docstring) from what its in-flight
    microbatches hold (``occupied``: :func:`held_activations` at the schedule's worst occupancy):
    GPipe's last microbatch kept whole (``gpipe_kept``), ZB-H1's deferred weight gradients' inputs
    (``pending_per_layer`` per layer: :func:`pending_weight_inputs`) and on the first stage
    (``first``) the in-flight embedding masks (``embedding`` bytes); a recomputed layer's full
    activations are a phase's (:func:`recompute_working_set`). Numbers or arrays alike."""
    per_full, per_sel, per_none = per_layer
    act = occupied + where(gpipe_kept, full * (per_none - per_full) + sel * (per_none - per_sel), 0.0)
    act = act + pending_per_layer * layers
    return act + where(first, embedding, 0.0)


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
