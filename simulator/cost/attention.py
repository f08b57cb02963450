"""The attention core of a layer: FlashAttention's fused kernel or the materialized scores."""

from __future__ import annotations

from simulator.cost.op import Op, elementwise, gemm
from simulator.specs import ModelSpec


def attention_ops(model: ModelSpec, b: int, heads: int, e: int) -> list[Op]:
    """The attention core of one layer on one TP rank (``heads`` = a/t query heads).

    ``model.attention == "flash"``: one fused kernel (FlashAttention-2, Dao 2023; torch
    ``scaled_dot_product_attention`` on GPU runs it) that never stores the s x s scores. Causal:
    it skips the blocks above the diagonal, so it executes half of the 4*b*s^2*h/t FLOPs of
    scores and attention-times-V: 2*b*heads*s^2*head_dim (FlashAttention-2, section 3.1; the
    paper counts causal FLOPs the same way). Traffic: read Q, K, V, write O (e each) and the
    fp32 row log-sum-exp (4 bytes per query row). Its backward recomputes the scores:
    5 GEMMs to the forward's 2, 2.5x the forward FLOPs (FlashAttention-2, section 4.1;
    :func:`simulator.cost.ops.backward_ops`).
    ``"materialized"``: scores = baddbmm(q, k^T), fused scale-mask-softmax, attention dropout
    and bmm with V, each a kernel over the s x s scores (Megatron-LM 2021)."""
    s, dh = model.seq_length, model.head_dim
    if model.attention == "flash":
        kv_heads = max(1, model.kv_heads * heads // model.num_attention_heads)
        io = e * b * s * dh * (2 * heads + 2 * kv_heads) + 4 * b * heads * s
        return [Op("flash_attention", "attention", 2.0 * b * heads * s * s * dh, float(io), s, s, dh, b * heads)]
    return [
        gemm("scores", s, s, dh, e, count=b * heads),
        elementwise("softmax", b * heads * s * s, 2 * e, 5, bwd_bytes_per_element=3 * e),
        elementwise("attn_dropout", b * heads * s * s, 2 * e + 1, 1, bwd_bytes_per_element=2 * e + 1),
        gemm("attn_v", s, dh, s, e, count=b * heads),
    ]
