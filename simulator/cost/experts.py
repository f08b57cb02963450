"""Mixture of experts: the MLP of a layer as E expert MLPs and a router (one home for its rules;
simulator.cost.params counts its parameters, simulator.cost.memory its activations).

As Megatron-core runs it (megatron/core/transformer/moe: ``MoELayer``, ``TopKRouter``,
``MoEAlltoAllTokenDispatcher``, ``GroupedMLP``), with expert tensor parallelism equal to t
(``--expert-tensor-parallel-size`` defaults to it): per microbatch on one TP rank,

* router: logits = x W_r over the rank's tokens (tok/t with sequence parallelism), softmax and
  top-k over the E experts;
* permute: each token copied once per chosen expert, grouped by expert (tok*k rows of h);
* experts: fc1, activation, fc2 as grouped GEMMs over the E experts, each on its tok*k/E tokens
  (balanced routing), each expert's width split by t;
* unpermute: the k outputs of each token weighted by their router probabilities and summed.

Before the experts the tensor ranks all-gather the routed tokens and after them reduce-scatter the
outputs, as the dense MLP does its tokens (the ``g``/``f`` collectives, Korthikanti et al. 2022),
on k times the rows: :func:`mlp_tensor_collectives`.
"""

from __future__ import annotations

from simulator.cost.op import Op, elementwise, gemm
from simulator.specs import ModelSpec


def expert_tokens(model: ModelSpec, b: int) -> int:
    """Rows of each expert's GEMMs per microbatch: b*s*k/E (balanced routing), at least 1."""
    return max(1, round(b * model.seq_length * model.mlp_copies / model.experts))


def moe_mlp_ops(model: ModelSpec, b: int, t: int, sp: bool, e: int) -> list[Op]:
    """The forward ops of a mixture-of-experts MLP on one TP rank (module docstring). Traffic:
    routing reads the logits and writes probabilities and indices (3e per logit); permute and
    unpermute read and write each routed row (2e per element); the activation as the dense MLP's."""
    s, h, f, E, k = model.seq_length, model.hidden_size, model.ffn, model.experts, model.mlp_copies
    tok = b * s
    tok_sp = tok / t if sp else tok
    rows = expert_tokens(model, b)
    ops = [
        gemm("router", round(tok_sp), E, h, e),
        elementwise("routing", tok_sp * E, 3 * e, 5, kernels=4),
        elementwise("permute", tok * k * h, 2 * e, 0, kernels=2),
    ]
    if model.activation == "swiglu":
        ops += [
            gemm("expert_fc1", rows, 2 * f // t, h, e, count=E),
            elementwise("swiglu", tok * k * f / t, 3 * e, 6, bwd_kernels=1, bwd_bytes_per_element=5 * e),
        ]
    else:
        ops += [
            gemm("expert_fc1", rows, f // t, h, e, count=E),
            elementwise("gelu", tok * k * f / t, 2 * e, 8, bwd_kernels=2, bwd_bytes_per_element=4 * e),
        ]
    ops.append(gemm("expert_fc2", rows, h, f // t, e, count=E))
    ops.append(elementwise("unpermute", tok * k * h, 2 * e, 2, kernels=2))
    return ops


def mlp_tensor_collectives(model: ModelSpec) -> int:
    """The MLP's tensor-parallel collectives per pass, in units of one b*s*h all-reduce: 1 for a
    dense MLP, k for a mixture of experts (its gathered and scattered rows are the k copies)."""
    return model.mlp_copies
