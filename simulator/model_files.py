"""Reading a model: a built-in name, an autoplan model YAML, or a Hugging Face ``config.json``
(:func:`load_model`), into the :class:`~simulator.specs.ModelSpec` the simulator prices. It sits
above simulator.cost: a Hugging Face model without a name is named by its parameter count."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwprofiles.errors import SpecError
from hwprofiles.load import build, did_you_mean, is_file, read_yaml
from hwprofiles.names import name_problem
from simulator.cost.params import total_params
from simulator.hf_unsupported import unsupported_architecture
from simulator.specs import HF_KEYS, ModelSpec

MODELS_DIR = Path(__file__).resolve().parent.parent / "autoplan" / "models"

log = logging.getLogger(__name__)


def model_from_hf_config(cfg: Mapping[str, Any], source: str, seq_len: int | None = None) -> ModelSpec:
    """Map a Hugging Face ``config.json`` (GPT-2 or Llama/Mistral/Qwen style, and their mixtures of
    experts: Mixtral, Qwen3-MoE, OLMoE, whose expert width is ``moe_intermediate_size`` or, for
    Mixtral, ``intermediate_size``) onto ModelSpec
    (SpecError when it cannot be used, or when a key makes it a model autoplan does not model:
    :mod:`simulator.hf_unsupported`). ``seq_len``: the sequence it will be planned for, when not
    the config's own."""
    data: dict[str, Any] = {}
    taken: dict[str, str] = {}  # ModelSpec key -> the config key it was read from
    for key, names in HF_KEYS.items():
        for n in names:
            if cfg.get(n) is not None:
                data[key], taken[key] = cfg[n], n
                break
    if not (isinstance(data.get("num_experts"), int) and data["num_experts"] >= 2):  # dense (0 or 1 expert)
        data.pop("num_experts", None)
        data.pop("moe_router_topk", None)
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or _default_activation(cfg)).lower()
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
    model = build(ModelSpec, data, source, _named_as_read(taken))
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
    return model.with_seq_length(seq_len, "--seq-len")


def _named_as_read(taken: Mapping[str, str]) -> dict[str, str]:
    """How an error names each ModelSpec key of a Hugging Face config: as the key it was read from
    (``taken``), or, missing, by the names it may have (``key 'num_hidden_layers' or 'n_layer' or
    'num_layers'``): hwprofiles.load.validation_message."""
    return {
        key: "key " + " or ".join(f"'{n}'" for n in ([taken[key]] if key in taken else names))
        for key, names in HF_KEYS.items()
    }


#: model types whose transformers config class defaults ``hidden_act`` to "silu" (LlamaConfig,
#: MistralConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig, OlmoeConfig in
#: transformers' models/*/configuration_*.py), so a config.json may leave it out
SILU_BY_DEFAULT = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "olmoe")


def _default_activation(cfg: Mapping[str, Any]) -> str:
    """The activation a Hugging Face config without ``hidden_act`` means: its config class's
    default (:data:`SILU_BY_DEFAULT`), gelu for the GPT-2 family and the others."""
    return "silu" if str(cfg.get("model_type", "")) in SILU_BY_DEFAULT else "gelu"
