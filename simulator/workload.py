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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simulator.specs import ModelSpec

OpKind = Literal["gemm", "bmm", "elementwise"]

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Op:
    """One kernel of the forward pass. ``count`` identical instances (batched GEMMs)."""

    name: str
    kind: OpKind
    flops: float
    bytes: float
    m: int = 0
    n: int = 0
    k: int = 0
    count: int = 1


def gemm(name: str, m: int, n: int, k: int, e: int, count: int = 1) -> Op:
    """C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs; reads A and B, writes C (e bytes per element)."""
    return Op(name, "gemm" if count == 1 else "bmm", 2.0 * m * n * k * count, float(e * (m * k + k * n + m * n) * count), m, n, k, count)


def elementwise(name: str, elements: float, bytes_per_element: float, flops_per_element: float = 1.0) -> Op:
    """A memory-bound op touching ``elements`` values with ``bytes_per_element`` of traffic each."""
    return Op(name, "elementwise", flops_per_element * elements, bytes_per_element * elements)


def layer_forward_ops(model: ModelSpec, b: int, t: int, sp: bool, e: int) -> list[Op]:
    """Forward ops of one transformer layer for a microbatch of b sequences on one TP rank.

    Elementwise traffic counts reads and writes: layernorm reads x, writes y (2e per element);
    dropout+residual reads two inputs, writes output and a 1-byte mask (3e+1); the fused
    scale-mask-softmax reads and writes the s*s scores (2e); attention dropout (2e+1).
    """
    s, h, a = model.seq_length, model.hidden_size, model.num_attention_heads
    f, kv = model.ffn, model.kv_size
    tok = b * s
    tok_sp = tok / t if sp else tok
    heads = a // t
    ops = [
        elementwise("ln1", tok_sp * h, 2 * e, 5),
        gemm("qkv", tok, (h + 2 * kv) // t, h, e),
        gemm("scores", s, s, model.head_dim, e, count=b * heads),
        elementwise("softmax", b * heads * s * s, 2 * e, 5),
        elementwise("attn_dropout", b * heads * s * s, 2 * e + 1, 1),
        gemm("attn_v", s, model.head_dim, s, e, count=b * heads),
        gemm("proj", tok, h, h // t, e),
        elementwise("dropout_residual1", tok_sp * h, 3 * e + 1, 2),
        elementwise("ln2", tok_sp * h, 2 * e, 5),
    ]
    if model.activation == "swiglu":
        ops += [
            gemm("fc1", tok, 2 * f // t, h, e),
            elementwise("swiglu", tok * f / t, 3 * e, 6),
        ]
    else:
        ops += [
            gemm("fc1", tok, f // t, h, e),
            elementwise("gelu", tok * f / t, 2 * e, 8),
        ]
    ops += [
        gemm("fc2", tok, h, f // t, e),
        elementwise("dropout_residual2", tok_sp * h, 3 * e + 1, 2),
    ]
    return ops


def embedding_forward_ops(model: ModelSpec, b: int, t: int, sp: bool, e: int) -> list[Op]:
    """Vocab-parallel embedding lookup (+ learned positions) and embedding dropout."""
    tok, h = b * model.seq_length, model.hidden_size
    return [
        elementwise("embedding", tok * h, 2 * e, 1),
        elementwise("embedding_dropout", (tok / t if sp else tok) * h, 2 * e + 1, 1),
    ]


def head_forward_ops(model: ModelSpec, b: int, t: int, sp: bool, e: int) -> list[Op]:
    """Final norm, vocab-parallel logits GEMM (2*b*s*h*V/t FLOPs) and fp32 cross-entropy."""
    tok, h, vocab = b * model.seq_length, model.hidden_size, model.vocab_size
    return [
        elementwise("final_norm", (tok / t if sp else tok) * h, 2 * e, 5),
        gemm("logits", tok, vocab // t if vocab % t == 0 else -(-vocab // t), h, e),
        # cross-entropy upcasts logits to fp32: read e, write 4 (softmax), read 4 for the loss
        elementwise("cross_entropy", tok * vocab / t, e + 8, 6),
    ]


def forward_flops(ops: list[Op]) -> float:
    return sum(o.flops for o in ops)


# ----------------------------------------------------------------------- closed forms

def layer_forward_flops(model: ModelSpec, b: int) -> float:
    """Forward FLOPs of one layer for b sequences at t = 1, general (GQA, any ffn, SwiGLU):
    2*b*s*h*(h + 2*kv)  [QKV] + 4*b*s^2*h [attention] + 2*b*s*h^2 [proj]
    + 2*b*s*h*f*(3 if SwiGLU else 2) [MLP].
    Reduces to 24*b*s*h^2 + 4*b*s^2*h for MHA, f = 4h, GELU (Narayanan et al. 2021)."""
    s, h, f, kv = model.seq_length, model.hidden_size, model.ffn, model.kv_size
    mlp = 3 if model.activation == "swiglu" else 2
    return 2 * b * s * h * (h + 2 * kv) + 4 * b * s * s * h + 2 * b * s * h * h + 2 * b * s * h * f * mlp


def logits_forward_flops(model: ModelSpec, b: int) -> float:
    """2*b*s*h*V: the LM head GEMM."""
    return 2.0 * b * model.seq_length * model.hidden_size * model.vocab_size


def model_flops_per_iteration(model: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one iteration, forward + backward, no recomputation: 3 * forward."""
    return 3.0 * (model.num_layers * layer_forward_flops(model, global_batch) + logits_forward_flops(model, global_batch))


def megatron_flops_with_recompute(model: ModelSpec, global_batch: int) -> float:
    """F = 96*B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h)) (Narayanan et al. 2021, eq. 3):
    forward + backward + one recomputed forward per layer, logits computed once forward+backward."""
    B, s, l, h, V = global_batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def executed_flops_per_iteration(model: ModelSpec, global_batch: int, full_layers: float, selective_layers: float) -> float:
    """FLOPs actually executed: model FLOPs plus recomputed forwards.

    ``full_layers``/``selective_layers`` are the (average over pipeline) numbers of layers
    recomputed fully / selectively; selective recompute redoes only the attention core
    (the 4*b*s^2*h score and attention-times-V FLOPs) (Korthikanti et al. 2022, section 5)."""
    b = global_batch
    attn_core = 4.0 * b * model.seq_length ** 2 * model.hidden_size
    return model_flops_per_iteration(model, b) + full_layers * layer_forward_flops(model, b) + selective_layers * attn_core
