"""What a run dir's ``plan.json`` holds for the runtime: model, plan, batch and training settings.

Pure Python (no torch): the emitter writes this format and the workers read it back.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hwprofiles.errors import InputError
from simulator.plan import (
    PLAN_INT_KEYS,
    PLAN_STR_KEYS,
    Plan,
    check_positive,
    parse_plan_items,
    resolve_plan,
    validate_plan,
)
from simulator.specs import ModelSpec

PLAN_FILE = "plan.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class TrainSettings:
    """Optimizer and data settings shared by the parallel run and its single-process reference.

    The timed phase uses AdamW (real optimizer state and step cost) with gradient clipping;
    the equivalence check uses plain SGD without clipping (a wrong gradient scale moves SGD's
    loss by far more than the tolerance, while clipping or Adam would hide it) and compares
    the global gradient norm as well as the loss.
    """

    seed: int = 1234
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    max_norm: float = 1.0
    check_lr: float = 0.5
    init_std: float = 0.02

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TrainSettings:
        known = {k: v for k, v in d.items() if k in TrainSettings.__dataclass_fields__}
        if "betas" in known:
            known["betas"] = tuple(known["betas"])
        return TrainSettings(**known)


@dataclass(frozen=True)
class RunSpec:
    """One training job as the runtime sees it."""

    model: ModelSpec
    plan: Plan
    global_batch: int
    train: TrainSettings = field(default_factory=TrainSettings)

    @property
    def world_size(self) -> int:
        return self.plan.gpus

    @property
    def num_microbatches(self) -> int:
        """Microbatches per pipeline per step: B / (d * mb)."""
        return self.global_batch // (self.plan.d * self.plan.mb)

    @property
    def local_batch(self) -> int:
        """Sequences one data-parallel rank processes per step."""
        return self.global_batch // self.plan.d


def plan_from_dict(d: dict[str, Any]) -> Plan:
    """Inverse of ``Plan.to_dict`` (lists back to tuples, ``num_microbatches`` dropped). A count
    must be a JSON integer and a name a string (TypeError naming the key): a hand-edited
    ``"d": "4"`` is not read as 4."""
    kw = {k: v for k, v in d.items() if k in Plan.__dataclass_fields__}
    for key, value in kw.items():
        if key in PLAN_STR_KEYS and not isinstance(value, str):
            raise TypeError(f"key '{key}': expected a string, got {value!r:.40}")
        counts = [value] if key in PLAN_INT_KEYS else _flat(value) if key in ("layers", "recompute") else []
        if any(not isinstance(x, int) or isinstance(x, bool) for x in counts):
            raise TypeError(f"key '{key}': expected integers, got {value!r:.40}")
    if kw.get("layers") is not None:
        kw["layers"] = tuple(kw["layers"])
    if kw.get("recompute") is not None:
        kw["recompute"] = tuple((f, s) for f, s in kw["recompute"])
    return Plan(**kw)


def _flat(value: Any) -> list[Any]:
    """The items of a list, or of a list of pairs (a recomputation map); None is no items."""
    if value is None:
        return []
    if not isinstance(value, list):
        return [value]
    return [y for x in value for y in (x if isinstance(x, list) else [x])]


def run_spec_to_dict(spec: RunSpec) -> dict[str, Any]:
    d = asdict(spec.train)
    d["betas"] = list(spec.train.betas)
    return {
        "model": spec.model.model_dump(),
        "plan": spec.plan.to_dict(spec.num_microbatches),
        "plan_string": spec.plan.to_string(),
        "global_batch": spec.global_batch,
        "num_microbatches": spec.num_microbatches,
        "world_size": spec.world_size,
        "train": d,
    }


def load_plan_json(run_dir: Path) -> dict[str, Any]:
    """The raw ``plan.json`` mapping of a run dir (InputError when missing or malformed)."""
    path = Path(run_dir) / PLAN_FILE
    if not Path(run_dir).is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    if not path.is_file():
        raise InputError(f"{path}: no such file (is {run_dir} a directory written by 'autoplan emit'?)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: malformed JSON: {e}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def load_run_spec(run_dir: Path) -> RunSpec:
    """Read and validate a run dir's ``plan.json``."""
    data = load_plan_json(run_dir)
    path = Path(run_dir) / PLAN_FILE
    for key in ("model", "plan", "global_batch"):
        if key not in data:
            raise InputError(f"{path}: missing key '{key}'")
    batch = data["global_batch"]
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise InputError(f"{path}: key 'global_batch': expected a positive integer, got {batch!r:.40}")
    source = f"{path}: key 'plan'"
    try:
        text = plan_from_dict(dict(data["plan"])).to_string()
    except (ValueError, TypeError) as e:
        raise InputError(f"{source}: {str(e).splitlines()[0]}") from None
    try:
        model = ModelSpec.model_validate(data["model"])
        train = TrainSettings.from_dict(dict(data.get("train") or {}))
    except (ValueError, TypeError, OverflowError) as e:
        raise InputError(f"{path}: invalid run spec: {str(e).splitlines()[0]}") from None
    return RunSpec(model=model, plan=_checked_plan(text, model, batch, source), global_batch=batch, train=train)


def _checked_plan(text: str, model: ModelSpec, global_batch: int, source: str) -> Plan:
    """The plan written as ``text`` read as ``--plan`` reads it, every key typed and every rule of
    simulator.plan checked (a hand-edited plan.json had run d=0 into a ZeroDivisionError and
    schedule=evil without a word); its GPUs are its own t*cp*p*d."""
    items = parse_plan_items(text, source)
    check_positive(items, source)
    gpus = math.prod(int(items.get(k, 1)) for k in ("t", "cp", "p", "d"))
    plan = resolve_plan(items, gpus, source)
    validate_plan(model, plan, gpus, global_batch, source)
    return plan
