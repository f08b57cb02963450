"""Model, plan and job specifications (docs/design.md section 2).

* :class:`ModelSpec` -- a GPT-style decoder, keys named after Megatron-LM arguments;
  built from autoplan YAML or a Hugging Face ``config.json`` (GPT-2 or Llama/Mistral/Qwen keys).
* :class:`Plan` -- one parallelization plan, parsed from ``t=8,p=8,d=24,mb=1,...``.
* :func:`validate_plan` -- every divisibility and consistency rule, each with its own message.

A model that cannot be loaded is a :class:`SpecError`; a plan that cannot be parsed or breaks a
rule is a :class:`PlanError` (both InputErrors: exit 2 on the command line).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwprofiles.errors import PlanError, SpecError
from hwprofiles.load import build, is_file, read_yaml
from hwprofiles.schema import ClusterSpec

MODELS_DIR = Path(__file__).resolve().parent.parent / "autoplan" / "models"


class ModelSpec(BaseModel):
    """A decoder-only transformer. ``num_query_groups`` is the number of KV heads (GQA/MQA)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "model"
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_query_groups: Optional[int] = Field(default=None, ge=1)
    ffn_hidden_size: Optional[int] = Field(default=None, ge=1)
    vocab_size: int = Field(ge=1)
    seq_length: int = Field(ge=1)
    activation: Literal["gelu", "swiglu"] = "gelu"
    tie_embeddings: bool = True
    position_embedding_type: Literal["learned_absolute", "rope"] = "learned_absolute"
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"

    @model_validator(mode="after")
    def _shapes(self) -> "ModelSpec":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be divisible by num_query_groups {self.kv_heads}"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    def with_seq_length(self, seq: int | None) -> "ModelSpec":
        return self if seq is None or seq == self.seq_length else self.model_copy(update={"seq_length": seq})


# Hugging Face config.json keys -> ModelSpec keys (first present key wins).
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_query_groups": ("num_key_value_heads", "multi_query_group_num"),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab_size": ("vocab_size",),
    "seq_length": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
}


def model_from_hf_config(cfg: Mapping[str, Any], source: str) -> ModelSpec:
    """Map a Hugging Face ``config.json`` (GPT-2 or Llama/Mistral/Qwen style) onto ModelSpec
    (SpecError when it cannot be used)."""
    data: dict[str, Any] = {"name": str(cfg.get("_name_or_path") or cfg.get("model_type") or Path(source).parent.name or "hf-model")}
    for key, names in _HF_KEYS.items():
        for n in names:
            if cfg.get(n) is not None:
                data[key] = cfg[n]
                break
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "gelu").lower()
    if act in ("silu", "swish", "swiglu"):
        data["activation"] = "swiglu"
    elif act.startswith("gelu"):
        data["activation"] = "gelu"
    else:
        raise SpecError(f"{source}: key 'hidden_act': unsupported activation {act!r} (expected gelu or silu/swiglu)")
    model_type = str(cfg.get("model_type", ""))
    llama_like = "rope_theta" in cfg or model_type in ("llama", "mistral", "qwen2", "qwen3", "mixtral", "gemma")
    data["tie_embeddings"] = bool(cfg.get("tie_word_embeddings", not llama_like))
    data["position_embedding_type"] = "rope" if llama_like else "learned_absolute"
    data["normalization"] = "RMSNorm" if ("rms_norm_eps" in cfg or llama_like) else "LayerNorm"
    return build(ModelSpec, data, source)


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
            raise SpecError(f"unknown model '{ref}' (built-in: {', '.join(builtin_models())}; or give a path)")
    data = _read_json(path) if path.suffix == ".json" and is_file(path) else read_yaml(path)
    if isinstance(data, Mapping) and is_hf_config(data):
        model = model_from_hf_config(data, str(path))
    else:
        model = build(ModelSpec, data, str(path))
    if seq_len is not None and seq_len < 1:
        raise SpecError(f"--seq-len: expected a positive integer, got {seq_len}")
    return model.with_seq_length(seq_len)


# ----------------------------------------------------------------------------- plans

CKPT_MODES = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
OFFLOADS = ("none", "cpu", "nvme")
PLAN_INT_KEYS = ("t", "p", "d", "mb", "zero", "v", "sp")
PLAN_STR_KEYS = {"ckpt": CKPT_MODES, "schedule": SCHEDULES, "offload": OFFLOADS}
PLAN_KEYS = PLAN_INT_KEYS + tuple(PLAN_STR_KEYS) + ("layers", "recompute")


@dataclass(frozen=True)
class Plan:
    """One parallelization plan (docs/design.md section 2, "Plan string").

    ``layers``: transformer layers per pipeline chunk, in model order (p*v entries), or None
    for the uniform split. ``recompute``: per pipeline chunk, (layers fully recomputed,
    layers selectively recomputed); the rest run without recomputation. None means every
    layer uses ``ckpt``. Both are chosen by the planner's CP-SAT model.
    """

    t: int = 1
    p: int = 1
    d: int = 1
    mb: int = 1
    zero: int = 0
    ckpt: str = "none"
    v: int = 1
    schedule: str = "1f1b"
    offload: str = "none"
    sp: int = 0
    layers: Optional[tuple[int, ...]] = None
    recompute: Optional[tuple[tuple[int, int], ...]] = None

    @property
    def model_parallel(self) -> int:
        return self.t * self.p

    @property
    def gpus(self) -> int:
        return self.t * self.p * self.d

    def replace(self, **kw: Any) -> "Plan":
        return dataclasses.replace(self, **kw)

    def to_string(self) -> str:
        s = (
            f"t={self.t},p={self.p},d={self.d},mb={self.mb},zero={self.zero},ckpt={self.ckpt},"
            f"v={self.v},schedule={self.schedule},offload={self.offload},sp={self.sp}"
        )
        if self.layers is not None:
            s += ",layers=" + "/".join(map(str, self.layers))
        if self.recompute is not None:
            s += ",recompute=" + "/".join(f"{f}:{sel}" for f, sel in self.recompute)
        return s

    def to_dict(self, num_microbatches: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "t": self.t, "p": self.p, "d": self.d, "mb": self.mb,
        }
        if num_microbatches is not None:
            out["num_microbatches"] = num_microbatches
        out.update({
            "zero": self.zero, "ckpt": self.ckpt, "v": self.v, "schedule": self.schedule,
            "offload": self.offload, "sp": self.sp,
        })
        if self.layers is not None:
            out["layers"] = list(self.layers)
        if self.recompute is not None:
            out["recompute"] = [list(x) for x in self.recompute]
        return out

    def chunk_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers in each of the p*v pipeline chunks (model order): explicit or uniform."""
        if self.layers is not None:
            return self.layers
        n = self.p * self.v
        base, extra = divmod(num_layers, n)
        return tuple(base + (1 if i < extra else 0) for i in range(n))

    def chunk_recompute(self, num_layers: int) -> tuple[tuple[int, int], ...]:
        """(full, selective) recomputed layers per chunk, explicit or from ``ckpt``."""
        if self.recompute is not None:
            return self.recompute
        return tuple(
            (n, 0) if self.ckpt == "full" else (0, n) if self.ckpt == "selective" else (0, 0)
            for n in self.chunk_layers(num_layers)
        )


def _parse_int(key: str, raw: str, source: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise PlanError(f"{source}: key '{key}': expected an integer, got {raw!r}") from None


def _parse_list(key: str, raw: str, source: str) -> tuple[int, ...]:
    # '-' separates too (24-24-24-24), so an empty part is an error: "-48/48" is not 48/48
    parts = raw.replace("-", "/").split("/")
    if any(x.strip() == "" for x in parts):
        raise PlanError(f"{source}: key '{key}': expected positive numbers separated by '/', got {raw!r}")
    return tuple(_parse_int(key, x, source) for x in parts)


def _parse_recompute(raw: str, source: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in raw.split("/"):
        full, _, sel = part.partition(":")
        out.append((_parse_int("recompute", full, source), _parse_int("recompute", sel or "0", source)))
    return tuple(out)


def parse_plan_items(text: str, source: str = "--plan") -> dict[str, Any]:
    """Parse ``key=val,...`` into typed values (no cross-key checks). Unknown keys are errors.

    Every error of parsing, resolving and validating a plan is a PlanError."""
    if not isinstance(text, str) or not text.strip():
        raise PlanError(f"{source}: empty plan (expected e.g. t=8,p=8,mb=1,ckpt=full)")
    items: dict[str, Any] = {}
    for chunk in text.split(","):
        chunk = chunk.strip()
        if not chunk:
            continue
        key, sep, val = chunk.partition("=")
        key, val = key.strip(), val.strip()
        if not sep or not key:
            raise PlanError(f"{source}: expected key=value, got {chunk!r}")
        if key not in PLAN_KEYS:
            raise PlanError(f"{source}: unknown key '{key}' (expected one of {', '.join(PLAN_KEYS)})")
        if key in items:
            raise PlanError(f"{source}: key '{key}' given twice")
        if key in PLAN_INT_KEYS:
            items[key] = _parse_int(key, val, source)
        elif key in PLAN_STR_KEYS:
            val = val.lower()
            if val not in PLAN_STR_KEYS[key]:
                raise PlanError(f"{source}: key '{key}': expected one of {', '.join(PLAN_STR_KEYS[key])}, got {val!r}")
            items[key] = val
        elif key == "layers":
            items[key] = _parse_list(key, val, source)
        else:
            items[key] = _parse_recompute(val, source)
    return items


def resolve_plan(items: Mapping[str, Any], gpus: int, source: str = "--plan") -> Plan:
    """Fill defaults (d = gpus / (t*p); v>1 implies interleaved) and build a Plan."""
    kw = dict(items)
    t, p = kw.get("t", 1), kw.get("p", 1)
    for key in ("t", "p", "mb", "v"):
        if key in kw and kw[key] < 1:
            raise PlanError(f"{source}: key '{key}': expected a positive integer, got {kw[key]}")
    if "d" not in kw:
        if t < 1 or p < 1 or gpus % (t * p):
            raise PlanError(f"{source}: t*p = {t * p} does not divide the cluster's {gpus} GPUs")
        kw["d"] = gpus // (t * p)
    if kw.get("v", 1) > 1 and "schedule" not in kw:
        kw["schedule"] = "interleaved"
    return Plan(**kw)


def num_microbatches(plan: Plan, global_batch: int) -> int:
    return global_batch // (plan.d * plan.mb)


def plan_errors(model: ModelSpec, plan: Plan, gpus: int, global_batch: int) -> list[str]:
    """Every rule a plan breaks for this model, GPU count and global batch (empty: valid)."""
    e: list[str] = []
    for key in ("t", "p", "d", "mb", "v"):
        if getattr(plan, key) < 1:
            e.append(f"{key} must be a positive integer, got {getattr(plan, key)}")
    if e:
        return e
    if plan.zero not in (0, 1, 2, 3):
        e.append(f"zero must be 0, 1, 2 or 3, got {plan.zero}")
    if plan.sp not in (0, 1):
        e.append(f"sp must be 0 or 1, got {plan.sp}")
    if plan.t * plan.p * plan.d != gpus:
        e.append(f"t*p*d = {plan.t}*{plan.p}*{plan.d} = {plan.gpus} but the cluster has {gpus} GPUs")
    if model.num_attention_heads % plan.t:
        e.append(f"t={plan.t} does not divide num_attention_heads={model.num_attention_heads}")
    if model.kv_heads % plan.t:
        e.append(f"t={plan.t} does not divide the {model.kv_heads} KV heads (num_query_groups)")
    if model.ffn % plan.t:
        e.append(f"t={plan.t} does not divide ffn_hidden_size={model.ffn}")
    if plan.sp and plan.t == 1:
        e.append("sp=1 (sequence parallelism) needs t > 1")
    if plan.sp and model.seq_length % plan.t:
        e.append(f"sp=1 needs t={plan.t} to divide seq_length={model.seq_length}")
    if global_batch < 1:
        e.append(f"global batch must be positive, got {global_batch}")
    elif global_batch % (plan.d * plan.mb):
        e.append(f"global batch {global_batch} is not divisible by d*mb = {plan.d}*{plan.mb} = {plan.d * plan.mb}")
    m = global_batch // (plan.d * plan.mb) if global_batch > 0 else 0
    chunks = plan.p * plan.v
    if plan.v > 1 and plan.schedule != "interleaved":
        e.append(f"v={plan.v} needs schedule=interleaved (got {plan.schedule})")
    if plan.schedule == "interleaved":
        if plan.p < 2:
            e.append("schedule=interleaved needs p >= 2")
        if plan.v < 2:
            e.append("schedule=interleaved needs v >= 2 virtual stages per device")
        if m and m % plan.p:
            e.append(f"interleaved schedule needs the {m} microbatches to be a multiple of p={plan.p}")
    if plan.layers is None:
        if model.num_layers < chunks:
            e.append(f"p*v = {chunks} pipeline chunks exceed the model's {model.num_layers} layers")
        elif plan.v > 1 and model.num_layers % chunks:
            e.append(f"interleaving needs p*v = {chunks} to divide num_layers={model.num_layers}")
    else:
        if len(plan.layers) != chunks:
            e.append(f"layers= gives {len(plan.layers)} stage sizes, expected p*v = {chunks}")
        elif sum(plan.layers) != model.num_layers or min(plan.layers) < 1:
            e.append(f"layers= must be positive and sum to num_layers={model.num_layers}, got {'/'.join(map(str, plan.layers))}")
    if plan.recompute is not None:
        sizes = plan.chunk_layers(model.num_layers)
        if len(plan.recompute) != len(sizes):
            e.append(f"recompute= gives {len(plan.recompute)} entries, expected p*v = {chunks}")
        else:
            for i, ((f, s), n) in enumerate(zip(plan.recompute, sizes)):
                if f < 0 or s < 0 or f + s > n:
                    e.append(f"recompute= chunk {i}: {f} full + {s} selective exceeds its {n} layers")
                    break
    if plan.offload != "none" and plan.zero == 0:
        e.append(f"offload={plan.offload} needs zero >= 1 (ZeRO-Offload partitions the optimizer state)")
    if plan.offload == "nvme" and plan.zero != 3:
        e.append("offload=nvme needs zero=3 (ZeRO-Infinity)")
    return e


def validate_plan(model: ModelSpec, plan: Plan, gpus: int, global_batch: int, source: str = "--plan") -> int:
    """Raise PlanError with the first broken rule; return the microbatch count m."""
    errors = plan_errors(model, plan, gpus, global_batch)
    if errors:
        more = f" (and {len(errors) - 1} more: {'; '.join(errors[1:])})" if len(errors) > 1 else ""
        raise PlanError(f"{source}: {errors[0]}{more}")
    return num_microbatches(plan, global_batch)


def parse_plan(text: str, model: ModelSpec, gpus: int, global_batch: int, source: str = "--plan") -> tuple[Plan, int]:
    """Parse and validate a plan string; returns (plan, num_microbatches)."""
    plan = resolve_plan(parse_plan_items(text, source), gpus, source)
    return plan, validate_plan(model, plan, gpus, global_batch, source)


@dataclass(frozen=True)
class Runtime:
    """How the training program schedules what lies outside the model's math.

    ``dp_overlap``: gradient reduction is bucketed and overlapped with the backward pass
    (PyTorch DDP/FSDP, Megatron-core ``--overlap-grad-reduce``, DeepSpeed with buckets).
    False: one reduction after the last backward (Megatron-LM's 2021 "local" DDP,
    Megatron-DeepSpeed with gradient bucketing off, as in the vTrain measurements)."""

    name: str = "overlapped"
    dp_overlap: bool = True


OVERLAPPED = Runtime("overlapped", dp_overlap=True)
NO_DP_OVERLAP = Runtime("no-dp-overlap", dp_overlap=False)


@dataclass(frozen=True)
class Job:
    """Everything one prediction needs: model, cluster, a validated plan, the batch, and
    how the program runs (``runtime``)."""

    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    global_batch: int
    runtime: Runtime = OVERLAPPED

    @property
    def m(self) -> int:
        """Microbatches per pipeline per iteration: B / (d * mb)."""
        return num_microbatches(self.plan, self.global_batch)

    @property
    def seq(self) -> int:
        return self.model.seq_length

    @staticmethod
    def make(model: ModelSpec, cluster: ClusterSpec, plan: Plan, global_batch: int, source: str = "--plan",
             runtime: Runtime = OVERLAPPED) -> "Job":
        validate_plan(model, plan, cluster.num_gpus, global_batch, source)
        return Job(model, cluster, plan, global_batch, runtime)
