"""The work of one transformer layer, the embedding and the LM head, op by op.

Each op carries its FLOPs, its HBM traffic in bytes and, for GEMMs, its (m, n, k) shape,
for one microbatch on one tensor-parallel rank. Shapes follow Megatron-LM's layer
(Shoeybi et al. 2019; Narayanan et al. 2021, section 3.1; Korthikanti et al. 2022 for
sequence parallelism): QKV column-parallel, attention per head, output projection
row-parallel, MLP fc1 column-parallel, fc2 row-parallel; layernorm, dropout and residual
are elementwise and, with sequence parallelism, split over the sequence by t.

Forward FLOPs per layer per microbatch (t = 1, dense MHA, ffn = 4h, GELU):
    24*b*s*h^2 + 4*b*s^2*h                     (Narayanan et al. 2021, appendix)
Backward = 2x forward (input and weight gradients); full recomputation adds one forward.

The op lists follow the kernels Megatron-LM (and Megatron-DeepSpeed) launch in fp16 with
their fused kernels: apex FusedLayerNorm, bias folded into the QKV GEMM, baddbmm scores,
fused scale-mask-softmax, attention dropout, bmm, a permute copy of the context, the
TorchScript bias-dropout-add and bias-GeLU fusions (megatron/model/transformer.py,
fused_bias_gelu.py, fused_softmax.py). Each Op records how many kernels it launches forward
(``kernels``) and backward (``bwd_kernels``) and its backward traffic (``bwd_bytes``), so the
op-time model can charge the host's per-kernel issue time (simulator.cost.ops). Backward-only work
(bias-gradient reductions, gradient accumulation into the parameters' .grad) is listed by
:func:`layer_backward_extra_ops`, :func:`embedding_backward_extra_ops` and
:func:`head_backward_extra_ops`.

Vocabulary padding: Megatron-LM pads the vocabulary to a multiple of
``make-vocab-size-divisible-by`` (default 128) times t (megatron/tokenizer/tokenizer.py,
``_vocab_size_with_padding``), e.g. GPT-2's 50257 becomes 50304 at t = 1 and 51200 at t = 8;
see :func:`padded_vocab_size`. The simulator's stage costs use the padded size.
"""

from __future__ import annotations

from simulator.cost.attention import attention_ops
from simulator.cost.experts import moe_mlp_ops
from simulator.cost.op import Op, elementwise, gemm
from simulator.cost.precision import fp8_cast_op, gemm_dtype
from simulator.plan import Precision
from simulator.specs import ModelSpec

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128  # Megatron-LM --make-vocab-size-divisible-by default


def padded_vocab_size(model: ModelSpec, t: int, divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Megatron-LM's padded vocabulary: the smallest multiple of divisible_by * t that holds
    the vocabulary (megatron/tokenizer/tokenizer.py ``_vocab_size_with_padding``)."""
    multiple = divisible_by * t
    return -(-model.vocab_size // multiple) * multiple


def layer_param_tensors(model: ModelSpec) -> int:
    """Parameter tensors of one layer: a GPT layer has a weight and a bias for each of ln1,
    QKV, proj, ln2, fc1 and fc2 (12); a Llama-style layer 2 norm weights and 4 weight matrices
    (SwiGLU: 5, the gate and up projections separate); a mixture of experts E MLPs' and a router."""
    mlp = 2 if model.activation != "swiglu" else 3  # fc1, fc2 (SwiGLU: gate and up apart)
    router = 1 if model.num_experts else 0  # a mixture of experts: E expert MLPs and a router
    if model.normalization == "LayerNorm":
        return 8 + 2 * 2 * model.experts + router  # weights and biases; MLP: fc1 and fc2
    return 4 + mlp * model.experts + router


def layer_forward_ops(model: ModelSpec, b: int, t: int, sp: bool, e: int, prec: str = "bf16") -> list[Op]:
    """Forward ops of one transformer layer for a microbatch of b sequences on one TP rank;
    with ``prec`` fp8 the linear GEMMs compute in fp8 and their casts are one more op
    (simulator.cost.precision).

    Traffic (e bytes per activation element) counts reads and writes; backward traffic is
    given where it is not twice the forward's:
      ln1/ln2 (apex FusedLayerNorm): read x, write y: 2e; backward two kernels (dx; dgamma
          and dbeta) reading x and dy, writing dx: 3e.
      qkv (ColumnParallelLinear, bias in the GEMM epilogue).
      scores = baddbmm(q, k^T) and attn_v = bmm(p, v): b*a/t batched GEMMs.
      softmax (fused scale-mask-softmax): read and write the s*s scores: 2e; backward reads
          y and dy, writes dx: 3e.
      attn_dropout: read, write and a 1-byte mask: 2e+1 (backward the same).
      context_copy: context.permute(2,0,1,3).contiguous(): 2e (backward the same).
      proj / fc2 (RowParallelLinear, skip_bias_add), fc1 (ColumnParallelLinear, skip_bias_add).
      dropout_residual1/2 (bias_dropout_add_fused_train: RNG + one fused kernel): read x and
          the residual, write the output and the mask: 3e+1; backward: dropout grad (2e+1),
          bias-grad reduction (e) and the sum of the residual branches' gradients (3e): 6e+1
          in three kernels.
      gelu (bias_gelu_impl): read, write: 2e; backward: fused grad (3e) and bias-grad
          reduction (e) in two kernels.
    """
    s, h, a = model.seq_length, model.hidden_size, model.num_attention_heads
    kv = model.kv_size
    tok = b * s
    tok_sp = tok / t if sp else tok
    heads = a // t
    ops = [
        elementwise("ln1", tok_sp * h, 2 * e, 5, bwd_kernels=2, bwd_bytes_per_element=3 * e),
        gemm("qkv", tok, (h + 2 * kv) // t, h, e, dtype=gemm_dtype(prec, "qkv")),
        *attention_ops(model, b, heads, e),
        elementwise("context_copy", tok * h / t, 2 * e, 0, bwd_bytes_per_element=2 * e),
        gemm("proj", tok, h, h // t, e, dtype=gemm_dtype(prec, "proj")),
        elementwise(
            "dropout_residual1", tok_sp * h, 3 * e + 1, 2, kernels=2, bwd_kernels=3, bwd_bytes_per_element=6 * e + 1
        ),
        elementwise("ln2", tok_sp * h, 2 * e, 5, bwd_kernels=2, bwd_bytes_per_element=3 * e),
    ]
    if model.num_experts:  # a mixture of experts (simulator.cost.experts)
        ops += moe_mlp_ops(model, b, t, sp, e)
    else:
        ops += dense_mlp_ops(model, tok, t, e, prec)
    ops += [
        elementwise(
            "dropout_residual2", tok_sp * h, 3 * e + 1, 2, kernels=2, bwd_kernels=3, bwd_bytes_per_element=6 * e + 1
        ),
    ]
    if prec == Precision.FP8:
        ops.append(fp8_cast_op(model, b, t, e))
    return ops


def dense_mlp_ops(model: ModelSpec, tok: int, t: int, e: int, prec: str) -> list[Op]:
    """Forward ops of a dense MLP over ``tok`` tokens on one TP rank (:func:`layer_forward_ops`):
    SwiGLU (fc1 computing the gate and up projections, the fused swiglu) or GELU (fc1, the fused
    bias-gelu), then fc2."""
    h, f = model.hidden_size, model.ffn
    if model.activation == "swiglu":
        return [
            gemm("fc1", tok, 2 * f // t, h, e, dtype=gemm_dtype(prec, "fc1")),
            elementwise("swiglu", tok * f / t, 3 * e, 6, bwd_kernels=1, bwd_bytes_per_element=5 * e),
            gemm("fc2", tok, h, f // t, e, dtype=gemm_dtype(prec, "fc2")),
        ]
    return [
        gemm("fc1", tok, f // t, h, e, dtype=gemm_dtype(prec, "fc1")),
        elementwise("gelu", tok * f / t, 2 * e, 8, bwd_kernels=2, bwd_bytes_per_element=4 * e),
        gemm("fc2", tok, h, f // t, e, dtype=gemm_dtype(prec, "fc2")),
    ]


def layer_backward_extra_ops(model: ModelSpec, b: int, t: int, sp: bool, e: int, params_per_rank: float) -> list[Op]:
    """Backward-only work of one layer per microbatch (no forward counterpart):
    qkv_grad: the q, k, v gradients written back into the fused QKV layout (split/view
        backward: read and write, 2e) plus the QKV bias-gradient reduction (e);
    grad_accum: each parameter's new gradient added to its accumulated .grad (AccumulateGrad
        in fp16 for DeepSpeed, main_grad.add_ for Megatron-LM): read both, write one: 3e per
        parameter, one kernel per parameter tensor.
    """
    s, h, kv = model.seq_length, model.hidden_size, model.kv_size
    tok = b * s
    qkv = tok * (h + 2 * kv) / t
    return [
        elementwise("qkv_grad", qkv, 3 * e, 0, kernels=2),
        elementwise("grad_accum", params_per_rank, 3 * e, 1, kernels=layer_param_tensors(model)),
    ]


def embedding_forward_ops(model: ModelSpec, b: int, t: int, sp: bool, e: int) -> list[Op]:
    """Vocab-parallel word-embedding gather (with t > 1 the out-of-range ids are masked:
    a few small kernels), learned positions gathered and added, the [b, s, h] -> [s, b, h]
    transpose copy, and embedding dropout."""
    tok, h = b * model.seq_length, model.hidden_size
    learned = model.position_embedding_type == "learned_absolute"
    ops = [elementwise("embedding", tok * h, 2 * e, 1, kernels=5 if t > 1 else 1, bwd_bytes_per_element=2 * e)]
    if learned:
        ops.append(elementwise("position_embedding", tok * h, 5 * e, 1, kernels=2, bwd_bytes_per_element=2 * e))
    ops += [
        elementwise("embedding_transpose", tok * h, 2 * e, 0, bwd_bytes_per_element=2 * e),
        elementwise("embedding_dropout", (tok / t if sp else tok) * h, 2 * e + 1, 1, bwd_bytes_per_element=2 * e + 1),
    ]
    return ops


def embedding_backward_extra_ops(model: ModelSpec, t: int, e: int, vocab: int | None = None) -> list[Op]:
    """Word-embedding weight gradient per microbatch: embedding_dense_backward zero-fills the
    V/t x h gradient and scatters the rows (writes V/t*h*e), then AccumulateGrad adds it to
    .grad (3e per element)."""
    v = (vocab if vocab is not None else model.vocab_size) / t
    return [elementwise("embedding_wgrad", v * model.hidden_size, 4 * e, 1, kernels=4)]


def head_forward_ops(
    model: ModelSpec, b: int, t: int, sp: bool, e: int, vocab: int | None = None, gathered: bool = False
) -> list[Op]:
    """Final norm, vocab-parallel logits GEMM (2*b*s*h*V/t FLOPs) and Megatron's fp32
    vocab-parallel cross-entropy (megatron/mpu/cross_entropy.py) on the b*s*V/t logits:
      forward: logits.float() (read e, write 4), max (4), subtract max in place (8),
          exp in place (8), sum (4), divide in place (8, the saved softmax): 36+e bytes per
          logit, about 14 kernels with the target masking and gathers;
      backward: scale the saved softmax by the incoming gradient in place (8) and cast back
          to the logits' dtype (4+e): 12+e bytes, about 5 kernels.
    ``vocab`` (e.g. :func:`padded_vocab_size`) overrides the model's vocabulary; each rank
    holds ceil(V/t) columns. ``gathered``: the ranks' logits are all-gathered before the loss
    (Runtime.cross_entropy "gathered", DeepSpeed's AutoTP), so every rank's cross-entropy runs
    over the whole vocabulary, b*s*V logits."""
    tok, h = b * model.seq_length, model.hidden_size
    vocab = model.vocab_size if vocab is None else vocab
    v_rank = vocab // t if vocab % t == 0 else -(-vocab // t)
    loss_columns = vocab if gathered else v_rank
    return [
        elementwise("final_norm", (tok / t if sp else tok) * h, 2 * e, 5, bwd_kernels=2, bwd_bytes_per_element=3 * e),
        gemm("logits", tok, v_rank, h, e),
        elementwise(
            "cross_entropy", tok * loss_columns, 36 + e, 6, kernels=14, bwd_kernels=5, bwd_bytes_per_element=12 + e
        ),
    ]


def head_backward_extra_ops(model: ModelSpec, t: int, e: int, vocab: int | None = None) -> list[Op]:
    """The logits' weight gradient (the tied word embedding, or the untied output layer) is
    added to its accumulated .grad every microbatch: 3e per element of V/t x h."""
    v = (vocab if vocab is not None else model.vocab_size) / t
    return [elementwise("logits_grad_accum", v * model.hidden_size, 3 * e, 1)]


def forward_flops(ops: list[Op]) -> float:
    return sum(o.flops for o in ops)


# ----------------------------------------------------------------------- closed forms


def layer_forward_flops(model: ModelSpec, b: int) -> float:
    """Forward FLOPs of one layer for b sequences at t = 1, general (GQA, any ffn, SwiGLU):
    2*b*s*h*(h + 2*kv)  [QKV] + 4*b*s^2*h [attention] + 2*b*s*h^2 [proj]
    + 2*b*s*h*f*(3 if SwiGLU else 2) [MLP]; a mixture of experts runs k MLPs per token and a
    2*b*s*h*E router (Mixtral 8x7B: 12.9 B of its 46.7 B parameters per token).
    Reduces to 24*b*s*h^2 + 4*b*s^2*h for MHA, f = 4h, GELU (Narayanan et al. 2021). The
    attention term is 4*b*s*S*h with S the keys a query attends over (S = s; a context-parallel
    rank's chunk of s/cp tokens attends over all of them, simulator.cost.context)."""
    s, h, f, kv = model.seq_length, model.hidden_size, model.ffn, model.kv_size
    mlp = 3 if model.activation == "swiglu" else 2
    attention = 4 * b * s * model.attention_keys * h
    router = 2 * b * s * h * model.experts if model.num_experts else 0
    experts = 2 * b * s * h * f * mlp * model.mlp_copies  # each token through k MLPs (1 when dense)
    return 2 * b * s * h * (h + 2 * kv) + attention + 2 * b * s * h * h + experts + router


def logits_forward_flops(model: ModelSpec, b: int) -> float:
    """2*b*s*h*V: the LM head GEMM."""
    return 2.0 * b * model.seq_length * model.hidden_size * model.vocab_size


def model_flops_per_iteration(model: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one iteration, forward + backward, no recomputation: 3 * forward."""
    return 3.0 * (
        model.num_layers * layer_forward_flops(model, global_batch) + logits_forward_flops(model, global_batch)
    )


def megatron_flops_with_recompute(model: ModelSpec, global_batch: int) -> float:
    """F = 96*B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h)) (Narayanan et al. 2021, eq. 3):
    forward + backward + one recomputed forward per layer, logits computed once forward+backward."""
    B, s, l, h, V = global_batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def executed_flops_per_iteration(
    model: ModelSpec, global_batch: int, full_layers: float, selective_layers: float
) -> float:
    """FLOPs actually executed: model FLOPs plus recomputed forwards.

    ``full_layers``/``selective_layers`` are the (average over pipeline) numbers of layers
    recomputed fully / selectively; selective recompute redoes only the attention core
    (the 4*b*s^2*h score and attention-times-V FLOPs) (Korthikanti et al. 2022, section 5)."""
    b = global_batch
    attn_core = 4.0 * b * model.seq_length * model.attention_keys * model.hidden_size
    return (
        model_flops_per_iteration(model, b) + full_layers * layer_forward_flops(model, b) + selective_layers * attn_core
    )
