"""Parallelization plans: the plan string, its keys and every rule a plan must keep
(docs/design.md section 2, "Plan string").

* :class:`Plan` -- one plan, parsed from ``t=8,p=8,d=24,mb=1,...``; its kinds are enums
  (:class:`Recompute`, :class:`Schedule`, :class:`Offload`) and its fields the matching Literals;
* :func:`parse_plan_items`, :func:`resolve_plan` -- the text to typed values, defaults filled;
* :func:`plan_errors` / :func:`validate_plan` -- every divisibility and consistency rule, each
  with its own message. A plan that cannot be parsed or breaks a rule is a :class:`PlanError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, get_args

from hwprofiles.errors import PlanError
from simulator.specs import ModelSpec


class Recompute(StrEnum):
    """Activation recomputation of a layer (Korthikanti et al. 2022)."""

    NONE = "none"
    SELECTIVE = "selective"  # the attention core only
    FULL = "full"  # the whole layer from its input


class Schedule(StrEnum):
    """Pipeline schedules (simulator.cost.schedules)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Offload(StrEnum):
    """Where ZeRO-Offload / ZeRO-Infinity keep the optimizer state (and ZeRO-3 parameters)."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


RecomputeName = Literal["none", "selective", "full"]
ScheduleName = Literal["gpipe", "1f1b", "interleaved"]
OffloadName = Literal["none", "cpu", "nvme"]
ZeroStage = Literal[0, 1, 2, 3]

CKPT_MODES: tuple[RecomputeName, ...] = get_args(RecomputeName)  # the enums' values, in order (tested)
SCHEDULES: tuple[ScheduleName, ...] = get_args(ScheduleName)
OFFLOADS: tuple[OffloadName, ...] = get_args(OffloadName)
ZERO_STAGES: tuple[ZeroStage, ...] = get_args(ZeroStage)
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
    zero: int = 0  # ZeroStage once validated (plan_errors)
    ckpt: RecomputeName = "none"
    v: int = 1
    schedule: ScheduleName = "1f1b"
    offload: OffloadName = "none"
    sp: int = 0
    layers: tuple[int, ...] | None = None
    recompute: tuple[tuple[int, int], ...] | None = None

    @property
    def model_parallel(self) -> int:
        return self.t * self.p

    @property
    def gpus(self) -> int:
        return self.t * self.p * self.d

    def replace(self, **kw: Any) -> Plan:
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
            "t": self.t,
            "p": self.p,
            "d": self.d,
            "mb": self.mb,
        }
        if num_microbatches is not None:
            out["num_microbatches"] = num_microbatches
        out.update(
            {
                "zero": self.zero,
                "ckpt": self.ckpt,
                "v": self.v,
                "schedule": self.schedule,
                "offload": self.offload,
                "sp": self.sp,
            }
        )
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
    e = [
        f"{key} must be a positive integer, got {getattr(plan, key)}"
        for key in ("t", "p", "d", "mb", "v")
        if getattr(plan, key) < 1
    ]
    if e:
        return e
    e += _layout_errors(model, plan, gpus)
    if global_batch < 1:
        e.append(f"global batch must be positive, got {global_batch}")
    elif global_batch % (plan.d * plan.mb):
        e.append(f"global batch {global_batch} is not divisible by d*mb = {plan.d}*{plan.mb} = {plan.d * plan.mb}")
    m = global_batch // (plan.d * plan.mb) if global_batch > 0 else 0
    return e + _schedule_errors(plan, m) + _split_errors(model, plan) + _memory_errors(plan)


def _layout_errors(model: ModelSpec, plan: Plan, gpus: int) -> list[str]:
    """ZeRO and SP values, t*p*d against the cluster, t against the heads, KV groups and ffn."""
    e: list[str] = []
    if plan.zero not in ZERO_STAGES:
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
    return e


def _schedule_errors(plan: Plan, m: int) -> list[str]:
    """Virtual stages need the interleaved schedule, which needs p >= 2, v >= 2 and m % p == 0."""
    e: list[str] = []
    if plan.v > 1 and plan.schedule != Schedule.INTERLEAVED:
        e.append(f"v={plan.v} needs schedule=interleaved (got {plan.schedule})")
    if plan.schedule == Schedule.INTERLEAVED:
        if plan.p < 2:
            e.append("schedule=interleaved needs p >= 2")
        if plan.v < 2:
            e.append("schedule=interleaved needs v >= 2 virtual stages per device")
        if m and m % plan.p:
            e.append(f"interleaved schedule needs the {m} microbatches to be a multiple of p={plan.p}")
    return e


def _split_errors(model: ModelSpec, plan: Plan) -> list[str]:
    """The layer split (uniform or layers=) and the recompute map against the model's layers."""
    e: list[str] = []
    chunks = plan.p * plan.v
    if plan.layers is None:
        if model.num_layers < chunks:
            e.append(f"p*v = {chunks} pipeline chunks exceed the model's {model.num_layers} layers")
        elif plan.v > 1 and model.num_layers % chunks:
            e.append(f"interleaving needs p*v = {chunks} to divide num_layers={model.num_layers}")
    elif len(plan.layers) != chunks:
        e.append(f"layers= gives {len(plan.layers)} stage sizes, expected p*v = {chunks}")
    elif sum(plan.layers) != model.num_layers or min(plan.layers) < 1:
        e.append(
            f"layers= must be positive and sum to num_layers={model.num_layers}, got {'/'.join(map(str, plan.layers))}"
        )
    if plan.recompute is not None:
        sizes = plan.chunk_layers(model.num_layers)
        if len(plan.recompute) != len(sizes):
            e.append(f"recompute= gives {len(plan.recompute)} entries, expected p*v = {chunks}")
        else:
            for i, ((f, s), n) in enumerate(zip(plan.recompute, sizes)):
                if f < 0 or s < 0 or f + s > n:
                    e.append(f"recompute= chunk {i}: {f} full + {s} selective exceeds its {n} layers")
                    break
    return e


def _memory_errors(plan: Plan) -> list[str]:
    """Offload needs a ZeRO stage that partitions the optimizer state; NVMe needs ZeRO-3."""
    e: list[str] = []
    if plan.offload != Offload.NONE and plan.zero == 0:
        e.append(f"offload={plan.offload} needs zero >= 1 (ZeRO-Offload partitions the optimizer state)")
    if plan.offload == Offload.NVME and plan.zero != 3:
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
