"""The model specification (docs/design.md section 2, "Model file").

:class:`ModelSpec` is a GPT-style decoder, keys named after Megatron-LM arguments, built from
autoplan YAML or a Hugging Face ``config.json`` (GPT-2 or Llama/Mistral/Qwen keys). A model that
cannot be loaded is a :class:`SpecError` (an InputError: exit 2 on the command line). Plans are
in :mod:`simulator.plan`, jobs in :mod:`simulator.job`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwprofiles.errors import SpecError
from hwprofiles.load import build, did_you_mean, is_file, read_yaml
from hwprofiles.names import Name, name_problem
from simulator.hf_unsupported import unsupported_architecture

MODELS_DIR = Path(__file__).resolve().parent.parent / "autoplan" / "models"

log = logging.getLogger(__name__)


# Hugging Face config.json keys -> ModelSpec keys (first present key wins).
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_query_groups": ("num_key_value_heads", "multi_query_group_num"),
    "ffn_hidden_size": ("moe_intermediate_size", "intermediate_size", "n_inner", "ffn_dim"),
    "num_experts": ("num_local_experts", "num_experts"),
    "moe_router_topk": ("num_experts_per_tok",),
    "vocab_size": ("vocab_size",),
    "seq_length": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
}


#: keys other tools spell differently -> ModelSpec's: what an unknown key of a model file was
#: likely meant to be (hwprofiles.load.validation_message's "did you mean")
_KEY_ALIASES = {name: key for key, names in _HF_KEYS.items() for name in names if name != key} | {
    "num_kv_heads": "num_query_groups",
    "n_kv_heads": "num_query_groups",
    "kv_heads": "num_query_groups",
    "num_heads": "num_attention_heads",
    "seq_len": "seq_length",
    "max_seq_len": "seq_length",
}


class ModelSpec(BaseModel):
    """A decoder-only transformer. ``num_query_groups`` is the number of KV heads (GQA/MQA)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    KEY_ALIASES: ClassVar[dict[str, str]] = _KEY_ALIASES

    name: Name = "model"  # hwprofiles.names: letters, digits, . _ + - /
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_query_groups: int | None = Field(default=None, ge=1)
    ffn_hidden_size: int | None = Field(default=None, ge=1)
    vocab_size: int = Field(ge=1)
    seq_length: int = Field(ge=1)
    activation: Literal["gelu", "swiglu"] = "gelu"
    tie_embeddings: bool = True
    position_embedding_type: Literal["learned_absolute", "rope"] = "learned_absolute"
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    # rotary base (Su et al. 2021): 10000 in GPT-NeoX / Llama 2, 500000 in Llama 3 (HF rope_theta)
    rope_theta: float = Field(default=10000.0, gt=0)
    # "flash": fused attention (FlashAttention / torch SDPA; Dao et al. 2022), no s x s scores
    # stored; "materialized": scores, softmax and dropout as separate kernels that keep the
    # s x s tensors (Megatron-LM 2021's fused softmax, Megatron-DeepSpeed without flash)
    attention: Literal["flash", "materialized"] = "flash"
    # mixture of experts (Megatron-LM --num-experts, --moe-router-topk): every layer's MLP is
    # num_experts expert MLPs of ffn_hidden_size (Megatron's --moe-ffn-hidden-size) and a router that
    # sends each token to moe_router_topk of them; None: a dense MLP
    num_experts: int | None = Field(default=None, ge=2)
    moe_router_topk: int = Field(default=2, ge=1)
    # the busiest expert-parallel rank's routed tokens over the mean (1: balanced routing; an
    # auxiliary load-balancing loss keeps it near 1): the rank the others wait for at each all-to-all
    moe_load_imbalance: float = Field(default=1.0, ge=1.0)

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be divisible by num_query_groups {self.kv_heads}"
            )
        if self.num_experts is not None and self.moe_router_topk > self.num_experts:
            raise ValueError(f"moe_router_topk {self.moe_router_topk} exceeds num_experts {self.num_experts}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def experts(self) -> int:
        """MLPs per layer: num_experts, or 1 (dense)."""
        return self.num_experts or 1

    @property
    def local_experts(self) -> int:
        """Experts a rank holds: all of them (an expert-parallel rank's share:
        simulator.cost.rank_view.RankModel)."""
        return self.experts

    @property
    def mlp_copies(self) -> int:
        """MLPs each token passes through per layer: the router's top-k, or 1 (dense)."""
        return self.moe_router_topk if self.num_experts else 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def attention_keys(self) -> int:
        """Keys each query attends over: the sequence (all of it, also for a context-parallel
        rank's shorter chunk: simulator.cost.rank_view.RankModel)."""
        return self.seq_length

    @property
    def max_positions(self) -> int:
        """Rows of a learned position embedding: the sequence length."""
        return self.seq_length

    def with_seq_length(self, seq: int | None) -> ModelSpec:
        return self if seq is None or seq == self.seq_length else self.model_copy(update={"seq_length": seq})


def model_from_hf_config(cfg: Mapping[str, Any], source: str, seq_len: int | None = None) -> ModelSpec:
    """Map a Hugging Face ``config.json`` (GPT-2 or Llama/Mistral/Qwen style, and their mixtures of
    experts: Mixtral, Qwen3-MoE, OLMoE, whose expert width is ``moe_intermediate_size`` or, for
    Mixtral, ``intermediate_size``) onto ModelSpec
    (SpecError when it cannot be used, or when a key makes it a model autoplan does not model:
    :mod:`simulator.hf_unsupported`). ``seq_len``: the sequence it will be planned for, when not
    the config's own."""
    data: dict[str, Any] = {}
    taken: dict[str, str] = {}  # ModelSpec key -> the config key it was read from
    for key, names in _HF_KEYS.items():
        for n in names:
            if cfg.get(n) is not None:
                data[key], taken[key] = cfg[n], n
                break
    if not (isinstance(data.get("num_experts"), int) and data["num_experts"] >= 2):  # dense (0 or 1 expert)
        data.pop("num_experts", None)
        data.pop("moe_router_topk", None)
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "gelu").lower()
    if act in ("silu", "swish", "swiglu"):
        data["activation"] = "swiglu"
    elif act.startswith("gelu"):
        data["activation"] = "gelu"
    else:
        raise SpecError(f"{source}: key 'hidden_act': unsupported activation {act!r} (expected gelu or silu/swiglu)")
    model_type = str(cfg.get("model_type", ""))
    llama_like = "rope_theta" in cfg or model_type in (
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "mixtral",
        "qwen3_moe",
        "olmoe",
        "gemma",
    )
    data["tie_embeddings"] = bool(cfg.get("tie_word_embeddings", not llama_like))
    data["position_embedding_type"] = "rope" if llama_like else "learned_absolute"
    data["normalization"] = "RMSNorm" if ("rms_norm_eps" in cfg or llama_like) else "LayerNorm"
    if cfg.get("rope_theta") is not None:
        data["rope_theta"] = cfg["rope_theta"]
    found = unsupported_architecture(cfg, seq_len or data.get("seq_length"))
    if found is not None:
        key, why = found
        raise SpecError(f"{source}: key '{key}': {why}; refusing to plan it as a different (dense) model")
    model = build(ModelSpec, data, source)
    model = model.model_copy(update={"name": _hf_name(cfg, source, model)})
    if seq_len is None and "seq_length" in taken:
        log.info(
            "%s: %s planned at %s-token sequences, its %s (the longest context it supports); "
            "give --seq-len for the length you train at",
            source,
            model.name,
            f"{model.seq_length:,}",
            taken["seq_length"],
        )
    return model


def _hf_name(cfg: Mapping[str, Any], source: str, model: ModelSpec) -> str:
    """The model's name: ``_name_or_path``, else its architecture (``architectures``, else
    ``model_type``) and size (``Qwen2ForCausalLM-7.6B``), else the config's folder (or "hf-model").
    A key's value that breaks the name rule (:mod:`hwprofiles.names`) is a SpecError naming the
    key; a folder's name that does is not used."""
    key = next((k for k in ("_name_or_path", "architectures", "model_type") if cfg.get(k)), None)
    if key is None:
        folder = Path(source).parent.name
        return folder if name_problem(folder) is None else "hf-model"
    value = cfg[key]
    if key == "architectures" and isinstance(value, list):
        value = value[0]
    name = str(value) if key == "_name_or_path" else f"{value}-{_size_label(model)}"
    problem = name_problem(name)
    if problem is not None:
        raise SpecError(f"{source}: key '{key}': {problem}")
    return name


def _size_label(model: ModelSpec) -> str:
    """The model's parameter count as a name shows it: ``7.6B``, ``124M``, ``85K``."""
    from simulator.cost.params import total_params  # simulator.cost imports this module

    n = total_params(model)
    if n >= 1e9:
        return f"{n / 1e9:.1f}B".replace(".0B", "B")
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def is_hf_config(data: Mapping[str, Any]) -> bool:
    return any(k in data for k in ("model_type", "n_embd", "num_hidden_layers", "architectures"))


def builtin_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def _read_json(path: Path) -> Any:
    """Parse a JSON file (a Hugging Face config.json); a malformed one is a SpecError."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: line {e.lineno} malformed JSON: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: cannot read: {e}") from None


def load_model(ref: str, seq_len: int | None = None) -> ModelSpec:
    """A built-in model name, an autoplan model YAML, or a Hugging Face config.json (SpecError
    when it is missing, malformed or invalid)."""
    path = Path(ref)
    if not (path.suffix in (".yaml", ".yml", ".json") or is_file(path)):
        path = MODELS_DIR / f"{ref}.yaml"
        if not is_file(path):
            known = builtin_models()
            raise SpecError(
                f"unknown model '{ref}'{did_you_mean(ref, known)} (built-in: {', '.join(known)}; or give a path)"
            )
    data = _read_json(path) if path.suffix == ".json" and is_file(path) else read_yaml(path)
    if isinstance(data, Mapping) and is_hf_config(data):
        model = model_from_hf_config(data, str(path), seq_len)
    else:
        model = build(ModelSpec, data, str(path))
    if seq_len is not None and seq_len < 1:
        raise SpecError(f"--seq-len: expected a positive integer, got {seq_len}")
    return model.with_seq_length(seq_len)
