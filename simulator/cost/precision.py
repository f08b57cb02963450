"""fp8 training (``prec=fp8``) as Transformer Engine runs it: what changes against bf16.

Transformer Engine's fp8 Linear (transformer_engine/pytorch/module/linear.py ``_Linear``;
layernorm_linear.py for the QKV and fc1 inputs, whose LayerNorm writes fp8 directly), used by
Megatron-core's TE layers under ``--fp8-format hybrid`` and by MosaicML's ``amp_fp8``:

* the four linear GEMMs of a layer (QKV, proj, fc1, fc2) and their dgrad and wgrad run in fp8
  (e4m3 forward, e5m2 gradients) at the GPU's fp8 peak times its own fp8 GEMM efficiency
  (``gemm.fp8``); attention, norms, activations, the embedding and the LM head stay bf16;
* casts: the proj and fc2 inputs are cast to fp8 (read e, write 1 byte per element; the QKV
  and fc1 inputs come out of the fused LayerNorm-cast); in backward every linear's output
  gradient is cast and transposed at once (``fp8_cast_transpose_fused``: read e, write 1 + 1),
  :func:`fp8_cast_op`. The weights: cast once per step when the program tells TE which
  microbatch is the first (``is_first_microbatch``: Megatron-core), 4 bytes per parameter per
  step, left out (under 0.1% of a step); otherwise every forward casts them again
  (:func:`weight_cast_op`, simulator.runtime_spec.Runtime.fp8_weight_cache);
* activations: each linear saves its fp8 input for its weight gradient, 1 byte per element
  instead of e (:func:`linear_input_bytes`, used by simulator.cost.memory.activation_bytes_per_layer);
* weights: the fp8 copy of each linear weight and its transpose (Hopper's fp8 GEMM takes only
  the TN layout), 2 bytes per parameter, cached across the step's microbatches
  (``weight_fp8``, ``weight_t_fp8``) beside the bf16 weights; under ZeRO-3 the gathered layer is
  cast on the fly, so only the working set's layers hold copies (:func:`fp8_weight_bytes`).

fp8 parameters (``fp8ag=1``; Megatron-LM ``--fp8-param-gather``, TransformerConfig ``fp8_param``:
"keep the parameters in fp8 precision to save memory", TE's ``fp8_model_init``), with a sharded
optimizer or FSDP: the layers' GEMM weights are stored as fp8 tensors, the optimizer writes them
from its fp32 master copy after each step, and every parameter all-gather moves them at 1 byte
(:func:`gathered_bytes`; the distributed optimizer's after the step, Megatron-FSDP's before each
pass). So no e-byte copy of those weights exists: a layer holds its fp8 weight and transpose,
2 bytes per parameter instead of e + 2 (:func:`fp8_layer_bytes`), a ZeRO-3 shard 1 byte instead of
e (:func:`fp8_shard_bytes`), and nothing is cast per microbatch (:func:`casts_every_forward`). A
layer's norms (under 0.1% of its parameters) are counted with its weights.

The amax-history and scaling state (a few floats per tensor) is left out.
"""

from __future__ import annotations

from typing import Any

from simulator.cost.memory import ZERO3_LAYERS_HELD
from simulator.cost.op import Op, elementwise
from simulator.numeric import minimum, where
from simulator.plan import Plan, Precision
from simulator.specs import ModelSpec

FP8: str = Precision.FP8.value  # a plain string: compared on the search's hot path
#: the layer's GEMMs that run in fp8 (simulator.cost.workload names)
FP8_LINEARS = ("qkv", "proj", "fc1", "fc2")
FP8_WEIGHT_COPY_BYTES = 2  # the fp8 weight and its transpose, per parameter


def gemm_dtype(prec: str, name: str) -> str | None:
    """The dtype GEMM ``name`` of a layer computes in: "fp8" for the linears under prec=fp8,
    else None (the GPU's default)."""
    return FP8 if prec == FP8 and name in FP8_LINEARS else None


def linear_input_bytes(prec: str, e: int) -> int:
    """Bytes per element of what a linear layer saves of its input for the weight gradient."""
    return 1 if prec == FP8 else e


def fp8_cast_op(model: ModelSpec, b: int, t: int, e: int) -> Op:
    """The fp8 casts of one layer per microbatch on one TP rank (module docstring): forward, the
    proj and fc2 inputs, b*s*(h + f)/t elements at e + 1 bytes; backward, the output gradients
    of QKV, proj, fc1 and fc2, b*s*((h + 2kv)/t + h + f_out/t + h) elements at e + 2 bytes
    (f_out = 2f with SwiGLU's fused gate and up projection), one kernel per linear."""
    s, h, f, kv = model.seq_length, model.hidden_size, model.ffn, model.kv_size
    tok = b * s
    forward = tok * (h + f) / t
    f_out = 2 * f if model.activation == "swiglu" else f
    backward = tok * ((h + 2 * kv) / t + h + f_out / t + h)
    return elementwise(
        "fp8_cast", forward, e + 1, 2, kernels=2, bwd_kernels=4, bwd_bytes_per_element=(e + 2) * backward / forward
    )


def weight_cast_op(model: ModelSpec, t: int, e: int) -> Op:
    """One forward's cast of a layer's linear weights on one TP rank when they are not cached
    across microbatches (module docstring): each weight read in e bytes and written as its fp8
    copy and fp8 transpose (``fp8_cast_transpose_fused``: e + 2 bytes per parameter), one kernel
    per linear; both are saved for the backward, which casts nothing more."""
    h, f, kv = model.hidden_size, model.ffn, model.kv_size
    mlp = 3 if model.activation == "swiglu" else 2
    weights = (h * (h + 2 * kv) + h * h + mlp * h * f) / t
    return elementwise("fp8_weight_cast", weights, e + 2, 1, kernels=len(FP8_LINEARS))


def casts_every_forward(fp8_weight_cache: bool, plan: Plan) -> bool:
    """Whether every forward of ``plan`` casts the layers' weights to fp8 (:func:`weight_cast_op`):
    :func:`casts_each_forward` of its precision and fp8 parameters."""
    return bool(casts_each_forward(fp8_weight_cache, plan.prec == FP8, plan.fp8ag))


def casts_each_forward(fp8_weight_cache: bool, fp8: Any, fp8ag: Any) -> Any:
    """Whether every forward casts the layers' weights to fp8: under prec=fp8 (``fp8``), by a
    program that does not cache the casts (simulator.runtime_spec.Runtime.fp8_weight_cache),
    unless the weights are fp8 already (``fp8ag``). Numbers or arrays alike."""
    return fp8 & (fp8ag == 0) & (not fp8_weight_cache)


def weight_cast_seconds(fp8_weight_cache: bool, fp8: Any, fp8ag: Any, weight_cast: Any) -> Any:
    """The fp8 weight casts a stage's microbatch adds (``weight_cast``: StageCost.weight_cast) where
    :func:`casts_each_forward`, else 0. Numbers or arrays alike."""
    return where(casts_each_forward(fp8_weight_cache, fp8, fp8ag), weight_cast, 0.0)


def fp8_layer_bytes(plan: Plan, layer_params: float, e: int) -> float:
    """Bytes one layer of ``layer_params`` parameters holds under prec=fp8 beyond its e-byte
    parameters: its fp8 weight copy and transpose, 2 per parameter; with fp8 parameters (fp8ag)
    the fp8 weight and transpose replace the e-byte weight, 2 - e; 0 in bf16."""
    if plan.prec != FP8:
        return 0.0
    return (FP8_WEIGHT_COPY_BYTES - (e if plan.fp8ag else 0)) * layer_params


def fp8_shard_bytes(fp8ag: Any, zero: Any, layer_params: Any, e: int, shard: Any) -> Any:
    """What fp8 parameters change in one layer's ZeRO-3 shard (counted at e bytes per parameter,
    simulator.cost.memory.model_state_bytes): 1 - e bytes per parameter of its 1/``shard`` share
    (the plan's shard group); 0 otherwise. Numbers or arrays alike."""
    return where((fp8ag != 0) & (zero == 3), (1 - e) * layer_params / shard, 0.0)


def fp8_layers_held(zero: Any, layers: Any) -> Any:
    """The layers whose fp8 copies a rank holding ``layers`` keeps: all of them, or under ZeRO-3
    the working set's gathered layers. Numbers or arrays alike."""
    return where(zero == 3, minimum(layers, ZERO3_LAYERS_HELD), layers)


def fp8_copies_bytes(
    layer_bytes: Any, layers: Any, zero: Any, fp8ag: Any, layer_params: Any, e: int, shard: Any
) -> Any:
    """What prec=fp8 adds to the memory of a rank holding ``layers`` layers of ``layer_params``
    parameters each, ``layer_bytes`` per layer (:func:`fp8_layer_bytes`):
    ``layer_bytes`` x :func:`fp8_layers_held` + ``layers`` x :func:`fp8_shard_bytes`. Numbers or
    arrays alike (the batch estimate's plans and stages)."""
    held = fp8_layers_held(zero, layers) * layer_bytes
    return held + layers * fp8_shard_bytes(fp8ag, zero, layer_params, e, shard)


def fp8_weight_bytes(plan: Plan, layers: int, layer_params: float, e: int) -> float:
    """:func:`fp8_copies_bytes` of ``plan``."""
    layer_bytes = fp8_layer_bytes(plan, layer_params, e)
    return fp8_copies_bytes(layer_bytes, layers, plan.zero, plan.fp8ag, layer_params, e, plan.shard_group)


def gathered_bytes(params: Any, layer_params: Any, e_gather: int, fp8ag: Any) -> Any:
    """Bytes of all-gathering ``params`` parameters of which ``layer_params`` are transformer
    layers': ``e_gather`` each (simulator.cost.state_bytes.param_gather_bytes), the layers' at 1 byte
    with fp8 parameters (fp8ag); the embedding and head stay in the 16-bit dtype. Numbers or
    arrays alike."""
    return where(fp8ag != 0, params * e_gather - (e_gather - 1) * layer_params, params * e_gather)
