"""Hugging Face ``config.json`` keys that change the architecture in a way autoplan does not model.

autoplan prices a dense, decoder-only transformer: every layer has one attention block (full
causal attention, learned or rotary positions, ``num_key_value_heads`` KV groups, head size
hidden/heads) followed by one MLP, in sequence. A config that says otherwise describes a
different model; planning it as the dense one gives a plan for a model the user does not have
(a Mixtral-8x7B config read as Mistral-7B: 7.2 B parameters instead of 46.7 B). So each key
below is refused, by name, when its value departs from the dense decoder:

* mixture of experts beyond routed experts in every layer (which autoplan models:
  ``num_local_experts`` / ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
  read by simulator.specs): shared experts (``n_shared_experts``, ``shared_expert_intermediate_size``:
  DeepSeek, Qwen2-MoE), DeepSeek's ``n_routed_experts`` layout, dense layers between MoE ones
  (``moe_layer_freq`` / ``decoder_sparse_step`` other than 1, ``mlp_only_layers``,
  ``first_k_dense_replace``);
* attention that is not full: ``sliding_window`` shorter than the sequence (Mistral v0.1;
  ignored when ``use_sliding_window`` is false, as Qwen2 sets it), ``layer_types`` /
  ``sliding_window_pattern`` (Gemma 2/3 local layers), ``attention_type`` other than global;
* other attention shapes: ``multi_query`` / ``new_decoder_architecture`` (Falcon),
  ``q_lora_rank`` / ``kv_lora_rank`` (DeepSeek multi-head latent attention), a ``head_dim``
  other than hidden/heads (Gemma, Qwen3);
* positions: ``alibi`` / ``position_embedding_type: alibi`` (BLOOM, MPT, Falcon);
* block structure: ``parallel_attn`` (Falcon), ``use_parallel_residual`` / ``parallel_residual``
  (GPT-NeoX, StableLM, Phi), ``num_nextn_predict_layers`` (multi-token prediction), and
  encoder-decoder or cross-attention models (``is_encoder_decoder``, ``add_cross_attention``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_MOE = "a mixture-of-experts layout autoplan does not model (it models routed experts in every layer)"


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _true(v: Any) -> bool:
    return v is True


#: key -> (does this value change the architecture?, what it is)
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n_routed_experts": (_positive, _MOE),
    "n_shared_experts": (_positive, _MOE),
    "shared_expert_intermediate_size": (_positive, _MOE),
    "moe_layer_freq": (lambda v: _positive(v) and v != 1, _MOE),
    "decoder_sparse_step": (lambda v: _positive(v) and v != 1, _MOE),
    "mlp_only_layers": (lambda v: isinstance(v, list) and len(v) > 0, _MOE),
    "first_k_dense_replace": (_positive, _MOE),
    "layer_types": (
        lambda v: isinstance(v, list) and any(str(x) != "full_attention" for x in v),
        "layers with local (sliding-window) attention (autoplan models full attention in every layer)",
    ),
    "sliding_window_pattern": (_positive, "layers with local (sliding-window) attention"),
    "attention_type": (lambda v: v not in (None, "global", "full", "full_attention"), "attention that is not full"),
    "multi_query": (_true, "Falcon's multi-query attention (give num_key_value_heads: 1 instead)"),
    "new_decoder_architecture": (_true, "Falcon's parallel attention/MLP decoder"),
    "q_lora_rank": (_positive, "multi-head latent attention (low-rank query/key/value projections)"),
    "kv_lora_rank": (_positive, "multi-head latent attention (low-rank query/key/value projections)"),
    "alibi": (_true, "ALiBi attention biases"),
    "position_embedding_type": (lambda v: str(v).lower() == "alibi", "ALiBi attention biases"),
    "parallel_attn": (_true, "attention and MLP in parallel (one residual add per layer)"),
    "use_parallel_residual": (_true, "attention and MLP in parallel (one residual add per layer)"),
    "parallel_residual": (_true, "attention and MLP in parallel (one residual add per layer)"),
    "num_nextn_predict_layers": (_positive, "multi-token prediction layers"),
    "is_encoder_decoder": (_true, "an encoder-decoder model (autoplan models decoder-only transformers)"),
    "add_cross_attention": (_true, "cross-attention layers (autoplan models decoder-only transformers)"),
}


def unsupported_architecture(cfg: Mapping[str, Any], seq_length: int | None) -> tuple[str, str] | None:
    """The first key of ``cfg`` (with what it means) that makes it a model autoplan does not
    model, or None. ``seq_length``: the sequence the model will be planned for (a sliding window
    at least that long attends to everything, so it changes nothing)."""
    for key, (departs, what) in _RULES.items():
        if key in cfg and departs(cfg[key]):
            return key, f"{what}: {key} = {cfg[key]!r}"
    window = cfg.get("sliding_window")
    window_on = cfg.get("use_sliding_window", True) is not False
    # only an integer length is compared: a config's "64" is refused when the model is built
    seq = seq_length if isinstance(seq_length, int) and not isinstance(seq_length, bool) else None
    if isinstance(window, int) and window > 0 and window_on and (seq is None or window < seq):
        return "sliding_window", (
            f"sliding-window attention over {window} tokens, shorter than the {f'{seq}-token ' if seq else ''}sequence "
            "(autoplan models full attention; a --seq-len within the window plans it exactly)"
        )
    heads, hidden, head_dim = cfg.get("num_attention_heads"), cfg.get("hidden_size"), cfg.get("head_dim")
    if (
        isinstance(head_dim, int)
        and isinstance(heads, int)
        and isinstance(hidden, int)
        and min(head_dim, heads, hidden) > 0
        and head_dim * heads != hidden
    ):
        return "head_dim", (
            f"a head size of {head_dim} with {heads} heads, not hidden_size/heads = {hidden / heads:g} "
            "(autoplan models heads of hidden_size/heads)"
        )
    return None
