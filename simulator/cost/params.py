"""Parameter counts: whole model, per layer, and per tensor-parallel rank.

Megatron-LM (Narayanan et al. 2021, section 5.1): with biases and LayerNorm (GPT-style),
    P = 12*l*h^2 * (1 + 13/(12h) + (V + s)/(12*l*h))
Per layer: QKV h*(h+2kv) + proj h*h + MLP h*f*(3 if SwiGLU else 2); GPT-style models add
biases (h+2kv + h + f + h) and two LayerNorms (4h); Llama-style (RMSNorm) models have no
biases and two norm weights (2h). A mixture of experts has E such MLPs (f the expert width)
and an h*E router: Mixtral 8x7B (h 4096, 32 layers, f 14336, 8 KV heads, V 32000) has
46,702,792,704 parameters.
"""

from __future__ import annotations

from typing import Any

from simulator.cost.cache import IdentityCache
from simulator.specs import ModelSpec

_PER_RANK = IdentityCache(1024)


def _has_bias(model: ModelSpec) -> bool:
    return model.normalization == "LayerNorm"


def layer_params(model: ModelSpec) -> int:
    """One layer: attention, norms and the MLP (E expert MLPs and an h x E router for a mixture
    of experts, Megatron-core's TopKRouter without bias)."""
    h, f, kv, E = model.hidden_size, model.ffn, model.kv_size, model.experts
    mlp = 3 if model.activation == "swiglu" else 2
    router = h * E if model.num_experts else 0
    weights = h * (h + 2 * kv) + h * h + E * mlp * h * f + router
    if _has_bias(model):
        return weights + (h + 2 * kv) + h + E * (f * (mlp - 1) + h) + 4 * h
    return weights + 2 * h


def embedding_params(model: ModelSpec) -> int:
    """Word embedding V*h plus learned positions s*h (none with rotary)."""
    pos = model.max_positions * model.hidden_size if model.position_embedding_type == "learned_absolute" else 0
    return model.vocab_size * model.hidden_size + pos


def head_params(model: ModelSpec) -> int:
    """Final norm plus the output projection (zero extra when tied to the embedding)."""
    norm = 2 * model.hidden_size if _has_bias(model) else model.hidden_size
    return norm + (0 if model.tie_embeddings else model.vocab_size * model.hidden_size)


def total_params(model: ModelSpec) -> int:
    return model.num_layers * layer_params(model) + embedding_params(model) + head_params(model)


def megatron_params_formula(model: ModelSpec) -> float:
    """P = 12*l*h^2 * (1 + 13/(12h) + (V+s)/(12*l*h)) (Narayanan et al. 2021, eq. in section 5.1)."""
    l, h, V, s = model.num_layers, model.hidden_size, model.vocab_size, model.max_positions
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def layer_params_per_rank(model: ModelSpec, t: int, experts: int | None = None) -> float:
    """One layer's parameters on one TP rank: the split weights and biases / t, the
    row-parallel biases and norms replicated (Shoeybi et al. 2019); of a mixture of experts the
    rank's ``experts`` (default: the E/ep it holds, ModelSpec.local_experts) and the router.
    Cached: the search asks for the same few tens of thousands of times."""
    return _PER_RANK.get_or_make((model,), (t, experts), lambda: _layer_params_per_rank(model, t, experts))


def _layer_params_per_rank(model: ModelSpec, t: int, experts: int | None) -> float:
    h, f, kv = model.hidden_size, model.ffn, model.kv_size
    E = model.local_experts if experts is None else experts
    mlp = 3 if model.activation == "swiglu" else 2
    split = h * (h + 2 * kv) + h * h + E * mlp * h * f  # experts split by t too (Megatron's default
    # expert tensor parallelism: --expert-tensor-parallel-size = t)
    replicated = h * model.experts if model.num_experts else 0  # the router (over all E experts)
    if _has_bias(model):
        split += (h + 2 * kv) + E * f * (mlp - 1)
        replicated += h + E * h + 4 * h
    else:
        replicated += 2 * h
    return split / t + replicated


def layer_sharded_extra(model: ModelSpec, t: int) -> float:
    """Parameters of one layer, beyond those a rank holds, whose sharded states it keeps a share
    of: the experts of the other ep ranks (each E/ep experts' states sharded over d/ep ranks
    amount to all E experts' over d: simulator.cost.rank_view); 0 without expert parallelism."""
    return layer_params_per_rank(model, t, model.experts) - layer_params_per_rank(model, t)


def embedding_params_per_rank(model: ModelSpec, t: int, vocab: int | None = None) -> float:
    """Vocab-parallel word embedding V*h/t plus replicated learned positions. ``vocab``
    overrides the model's vocabulary (e.g. Megatron's padded one, workload.padded_vocab_size)."""
    pos = model.max_positions * model.hidden_size if model.position_embedding_type == "learned_absolute" else 0
    return (vocab or model.vocab_size) * model.hidden_size / t + pos


def head_params_per_rank(model: ModelSpec, t: int, p: int, vocab: int | None = None) -> float:
    """Final norm plus the output layer. With tied embeddings and p > 1 the last stage holds
    its own copy of the word embedding (Megatron-LM keeps the two copies in sync)."""
    norm = 2 * model.hidden_size if _has_bias(model) else model.hidden_size
    untied_or_separate = (not model.tie_embeddings) or p > 1
    return norm + ((vocab or model.vocab_size) * model.hidden_size / t if untied_or_separate else 0.0)


def stage_params_per_rank(
    model: ModelSpec, t: int, p: int, layers: int, first: bool, last: bool, vocab: int | None = None
) -> float:
    """Parameters held by one rank of a pipeline stage of ``layers`` transformer layers
    (``vocab``: see :func:`embedding_params_per_rank`): :func:`stage_params`."""
    return stage_params(
        layers,
        first,
        last,
        layer_params_per_rank(model, t),
        embedding_params_per_rank(model, t, vocab),
        head_params_per_rank(model, t, p, vocab),
    )


def stage_params(layers: Any, first: Any, last: Any, layer: Any, embedding: Any, head: Any) -> Any:
    """layers * ``layer`` + the ``embedding``'s parameters on the first stage + the ``head``'s on
    the last; numbers or arrays alike (the batch estimate's plans and stages)."""
    return layers * layer + first * embedding + last * head
