"""The memory traffic an eager layer adds under ``torch.autocast`` over fp32 parameters
(``Runtime.layer_kernels == "eager"``: autoplan's program on a GPU without FSDP,
autoplan/runtime/trainer.py), beyond the fused kernel list of :mod:`simulator.cost.workload`.

What the program runs (autoplan/runtime/model.py, torch's autocast op lists, "CUDA Ops that
can autocast to float32" in the torch.amp documentation):

* the residual stream stays fp32: the embedding's output is fp32 (nn.Embedding is not cast),
  ``x + attn(...)`` promotes the bf16 branch to fp32, and ``layer_norm`` is on autocast's
  fp32 list, so both norms read and write 4-byte elements instead of 2 (+4 bytes per element
  each, forward; +6 backward: the input, the output gradient read and the input gradient
  written at 4 bytes), and each residual add reads fp32 + bf16 and writes fp32 (10 bytes, 3 more
  than the fused dropout-residual's 7; backward: the gradient cast to the branch's bf16, 6);
* every Linear casts its input to bf16 (read 4, write 2: 6 bytes), and no cache keeps
  activation casts: q, k and v each cast the norm's output, as do fc1 (and SwiGLU's gate);
  backward: each cast's gradient back to fp32 (6 bytes) and the fp32 gradients of the
  branches summed into the norm's output gradient (read 8, write 4 per extra branch);
* every weight is cast to bf16 once per forward (autocast's weight cache lives for the
  forward's context: read 4, write 2), and backward casts each bf16 weight gradient to fp32
  (6) and accumulates it into the fp32 ``.grad`` (read 8, write 4: 12, where the fused list's
  ``grad_accum`` charges 3 bf16 elements, 6): +12 bytes per parameter;
* rotary embeddings (``autoplan.runtime.model.apply_rope``, rotate-half form) run as separate
  kernels on q and k, where Megatron fuses them into the attention's input: four products of a
  half with cos or sin (each reads and writes half of the tensor: e bytes per element in all),
  a difference and a sum of halves (1.5 e each) and the concatenation (2 e): 9 e bytes per
  element of q and k forward, backward twice that (the elementwise default of
  simulator.cost.ops.backward_ops);
* grouped-query attention repeats k and v to the query heads (``repeat_interleave``): read
  kv / h, write 1 element per element of the repeated k and v, e bytes each; backward sums the
  copies back (the same bytes).

On gpt-1.3b at mb=4 (8,192 tokens of hidden 2,048) these add about 0.94 GB of forward and
1.8 GB of backward traffic per layer and microbatch, about 1.1 ms on an H100 (at the
calibrated 2.3-2.9 TB/s): the per-layer
time the measured runs take beyond the fused list (benchmarks/data/h100-2026-11-26b).
"""

from __future__ import annotations

from simulator.cost.memory import DROPOUT_MASK_BYTES
from simulator.cost.op import Op, elementwise
from simulator.specs import ModelSpec

#: bytes per element of a bf16 <- fp32 cast (read 4, write 2), and back
CAST_BYTES = 6.0
#: extra bytes per residual-stream element: forward two fp32 norms (+4 each) and two adds (+3
#: each); backward two norms (+6 each) and two adds' gradient casts to bf16 (6 each)
RESIDUAL_FORWARD_BYTES = 2 * 4.0 + 2 * 3.0
RESIDUAL_BACKWARD_BYTES = 2 * 6.0 + 2 * CAST_BYTES
#: bytes of one more fp32 gradient summed into another (read 8, write 4)
GRAD_SUM_BYTES = 12.0
#: extra backward bytes per parameter: bf16 -> fp32 gradient cast (6) and fp32 accumulation
#: (12) less the fused list's bf16 grad_accum (6)
WEIGHT_GRAD_BYTES = CAST_BYTES + 12.0 - 6.0


def input_casts(model: ModelSpec) -> tuple[int, int]:
    """Linears that cast the attention norm's and the MLP norm's output: q, k, v; fc1 (SwiGLU:
    gate and up)."""
    return 3, 2 if model.activation == "swiglu" else 1


def eager_activation_bytes(model: ModelSpec, b: int, t: int, sp: bool, ckpt: str, e: int = 2) -> float:
    """Bytes one layer of the eager program keeps for backward beyond
    simulator.cost.memory.activation_bytes_per_layer, per microbatch on one TP rank (s*b*h
    elements of the residual stream, split by t with sequence parallelism; f the MLP width):
        none, selective: (2(4 - e) + (c_a - 1 + c_m - 1) e - 2) s*b*h  +  e s*b*f / t (SwiGLU)
        full:            (4 - e) s*b*h
    where the two norms save their fp32 inputs (the residual stream is fp32: module docstring),
    each of the c_a, c_m Linears that cast a norm's output (:func:`input_casts`) saves its own
    bf16 copy where Megatron's fused QKV and fc1 save one, the program has no dropout (the formula's
    two 1-byte masks, memory.DROPOUT_MASK_BYTES), and SwiGLU's product ``silu(gate) * up`` saves
    the SiLU output beside its inputs (Megatron's fused swiglu saves only the inputs); a fully
    recomputed layer keeps its fp32 input. GPT (GELU, LayerNorm) with e = 2: 6 s*b*h; Llama
    (SwiGLU): 8 s*b*h + 2 s*b*f. A mixture of experts' MLP is left as the formula has it."""
    s, h = model.seq_length, model.hidden_size
    sbh = s * b * h / (t if sp else 1)
    wide = 4 - e  # an fp32 element beyond the e bytes the formula counts
    if ckpt == "full":
        return wide * sbh
    attn_casts, mlp_casts = input_casts(model)
    dense = not model.num_experts
    copies = attn_casts - 1 + (mlp_casts - 1 if dense else 0)
    silu = e * s * b * model.ffn / t if dense and model.activation == "swiglu" else 0.0
    return (2 * wide + copies * e - DROPOUT_MASK_BYTES) * sbh + silu


#: bytes per element of q and k of the unfused rotate-half rotary embedding, in units of e
ROPE_BYTES_PER_E = 4 * 1.0 + 2 * 1.5 + 2.0


def eager_layer_ops(model: ModelSpec, b: int, t: int, sp: bool, params_per_rank: float, e: int = 2) -> list[Op]:
    """The extra forward ops of one layer per microbatch on one TP rank, each with its backward
    traffic (module docstring); the residual stream is split over t only with sequence
    parallelism, each column-parallel Linear casts its whole (gathered) input, and the rotary
    embedding and GQA repeat run on the rank's h/t query and kv/t key/value columns (``e``:
    bytes of the compute dtype)."""
    tok, h = b * model.seq_length, model.hidden_size
    stream = (tok / t if sp else tok) * h
    attn, mlp = input_casts(model)
    casts = attn + mlp
    sums = (attn - 1) + (mlp - 1)
    linears = attn + 1 + mlp + 1  # the casting ones and the output projections (o, fc2)
    return [
        elementwise("autocast_residual_stream", stream, RESIDUAL_FORWARD_BYTES, 0, 0, 0, RESIDUAL_BACKWARD_BYTES),
        elementwise(
            "autocast_input_casts",
            tok * h,
            casts * CAST_BYTES,
            0,
            casts,
            casts + sums,
            casts * CAST_BYTES + sums * GRAD_SUM_BYTES,
        ),
        elementwise("autocast_weight_casts", params_per_rank, CAST_BYTES, 0, linears, linears, WEIGHT_GRAD_BYTES),
        *_position_and_group_ops(model, tok, t, e),
    ]


def _position_and_group_ops(model: ModelSpec, tok: int, t: int, e: int) -> list[Op]:
    """The unfused rotary embedding of q and k, and the GQA repeat of k and v (module docstring)."""
    h, kv = model.hidden_size / t, model.kv_size / t
    ops = []
    if model.position_embedding_type == "rope":
        ops.append(elementwise("eager_rope", tok * (h + kv), ROPE_BYTES_PER_E * e, 1, 7, 10))
    if kv < h:
        repeat = (1 + kv / h) * e
        ops.append(elementwise("gqa_repeat", 2 * tok * h, repeat, 0, 2, 2, repeat))
    return ops
