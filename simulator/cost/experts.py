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

With expert parallelism (ep) a rank holds E/ep experts: the permuted rows go to the rank of
their expert and come back in two all-to-alls over the ep ranks (dispatch and combine, and
their gradients in backward: :func:`all_to_all_time`), and the busiest rank computes the mean
share times the routing's load imbalance (:func:`routed_copies`). Expert gradients are reduced
and their states sharded over the d*cp/ep ranks holding the same experts
(simulator.cost.rank_view).

Before the experts the tensor ranks all-gather the routed tokens and after them reduce-scatter the
outputs, as the dense MLP does its tokens (the ``g``/``f`` collectives, Korthikanti et al. 2022),
on k times the rows: :func:`mlp_tensor_collectives`.
"""

from __future__ import annotations

from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, layout
from simulator.cost.op import Op, elementwise, gemm
from simulator.cost.rank_view import expert_parallel
from simulator.specs import ModelSpec


def routed_copies(model: ModelSpec) -> float:
    """Routed rows per token on the busiest rank: k, times the load imbalance when the experts are
    split over expert-parallel ranks (``moe_load_imbalance``: the busiest rank's tokens over the
    mean; without ep every rank holds every expert and the imbalance evens out)."""
    spread = model.local_experts < model.experts
    return model.mlp_copies * (model.moe_load_imbalance if spread else 1.0)


def expert_tokens(model: ModelSpec, b: int) -> int:
    """Rows of each of the rank's experts' GEMMs per microbatch: b*s*k/E with all E experts (balanced
    routing); an expert-parallel rank's E/ep experts take the rows of all ep ranks, b*s*k*imbalance
    / (E/ep); at least 1."""
    return max(1, round(b * model.seq_length * routed_copies(model) / model.local_experts))


def dispatch_bytes(model: ModelSpec, b: int, t: int, e: int) -> float:
    """Bytes one tensor rank sends into one token all-to-all (dispatch, or combine) per microbatch:
    its 1/t share of the b*s*k routed rows of h elements (Megatron's alltoall dispatcher splits
    the rows over the tensor ranks before the exchange), on the busiest rank times the imbalance."""
    return b * model.seq_length * routed_copies(model) * model.hidden_size * e / t


def all_to_all_time(model: ModelSpec, cluster: ClusterSpec, b: int, t: int, e: int) -> float:
    """One token all-to-all over the ep ranks (stride t) of a microbatch: each rank keeps 1/ep of
    its rows and sends the rest, ep-1 messages posted at once (NCCL's grouped send/recv):
        (ep-1)/ep * S / B + (ep-1) * a
    with S = :func:`dispatch_bytes` and B, a the ep group's link (simulator.cost.collectives);
    0 without expert parallelism. Megatron runs it on the compute stream: nothing hides it."""
    ep = expert_parallel(model)
    if ep == 1:
        return 0.0
    link = collectives.in_pass_link(cluster, layout.group_shape(ep, t, cluster.gpus_per_node))
    bw, lat = link.figures("send_recv")
    return (ep - 1) / ep * dispatch_bytes(model, b, t, e) / bw + (ep - 1) * lat


#: token all-to-alls per layer and pass: dispatch and combine forward, their gradients backward
ALL_TO_ALLS_PER_PASS = 2


def moe_mlp_ops(model: ModelSpec, b: int, t: int, sp: bool, e: int) -> list[Op]:
    """The forward ops of a mixture-of-experts MLP on one TP rank (module docstring). Traffic:
    routing reads the logits and writes probabilities and indices (3e per logit); permute and
    unpermute read and write each routed row (2e per element); the activation as the dense MLP's."""
    s, h, f, E, k = model.seq_length, model.hidden_size, model.ffn, model.local_experts, routed_copies(model)
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


def mlp_tensor_collectives(model: ModelSpec) -> float:
    """The MLP's tensor-parallel collectives per pass, in units of one b*s*h all-reduce: 1 for a
    dense MLP, the routed copies for a mixture of experts (its gathered and scattered rows:
    :func:`routed_copies`)."""
    return routed_copies(model)
