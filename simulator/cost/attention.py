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
    and bmm with V, each a kernel over the s x s scores (Megatron-LM 2021).

    Context parallelism (simulator.cost.context: ``model`` a rank's view, s its s/cp tokens
    and S = ``model.attention_keys`` = cp*s the keys): the rank's queries attend over all S
    keys, 2*b*heads*s*S*head_dim FLOPs (1/cp of the causal whole, balanced by the 2*cp chunk
    split) in cp kernels, one per ring step, each of a step's s-token shape; it reads all S
    keys and values as they arrive; and each step's partial output is merged into the result
    with its log-sum-exp (Transformer Engine ``flash_attn_fwd_out_correction``: read the
    step's output, read and write the result, 3e per element, two kernels; its backward
    accumulates dQ and dK/dV step by step, twice the traffic)."""
    s, dh = model.seq_length, model.head_dim
    if model.attention == "flash":
        keys = model.attention_keys
        steps = keys // s
        kv_heads = max(1, model.kv_heads * heads // model.num_attention_heads)
        io = e * b * dh * (2 * heads * s + 2 * kv_heads * keys) + 4 * b * heads * s
        flops = 2.0 * b * heads * s * keys * dh
        ops = [Op("flash_attention", "attention", flops, float(io), s, s, dh, b * heads, steps, steps)]
        if steps > 1:
            ops.append(elementwise("cp_out_correction", b * s * heads * dh * steps, 3 * e, 2, kernels=2 * steps))
        return ops
    return [
        gemm("scores", s, s, dh, e, count=b * heads),
        elementwise("softmax", b * heads * s * s, 2 * e, 5, bwd_bytes_per_element=3 * e),
        elementwise("attn_dropout", b * heads * s * s, 2 * e + 1, 1, bwd_bytes_per_element=2 * e + 1),
        gemm("attn_v", s, dh, s, e, count=b * heads),
    ]
