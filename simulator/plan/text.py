"""The plan string ``t=8,p=8,mb=1,...`` to typed values (:func:`parse_plan_items`), defaults filled
into a :class:`Plan` (:func:`resolve_plan`); every error is a :class:`PlanError` naming the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofiles.errors import PlanError
from hwprofiles.number_text import parse_integer
from simulator.plan.fields import PLAN_INT_KEYS, PLAN_KEYS, PLAN_STR_KEYS, Plan


def _parse_int(key: str, raw: str, source: str) -> int:
    try:
        return parse_integer(raw)
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
    """Parse ``key=val,...`` into typed values (no cross-key checks). Unknown keys are errors. A
    bare schedule name (``zbv``, any case), as the plan tables print it, is ``schedule=`` it.

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
        if not sep and key.lower() in PLAN_STR_KEYS["schedule"]:  # a bare schedule name, as the plan tables print it
            key, sep, val = "schedule", "=", key
        if not sep or not key:
            raise PlanError(f"{source}: expected key=value or a schedule name, got {chunk!r}")
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
    if not items:
        raise PlanError(f"{source}: no key=value item in {text!r} (expected e.g. t=8,p=8,mb=1,ckpt=full)")
    return items


#: plan keys that count or size something: each must be at least 1
POSITIVE_KEYS = ("t", "p", "mb", "v", "cp", "d", "ep")
#: those resolve_plan needs before building a Plan (d and ep are checked with the Plan, rules.py)
_LAYOUT_KEYS = ("t", "p", "mb", "v", "cp")


def check_positive(items: Mapping[str, Any], source: str, keys: tuple[str, ...] = POSITIVE_KEYS) -> None:
    """PlanError when a counting key of ``items`` (``keys``, default POSITIVE_KEYS) is below 1:
    --fix pins keys that size the search's loops (a cp of 0 divided by zero there)."""
    for key in keys:
        if key in items and items[key] < 1:
            raise PlanError(f"{source}: key '{key}': expected a positive integer, got {items[key]}")


def resolve_plan(items: Mapping[str, Any], gpus: int, source: str = "--plan") -> Plan:
    """Fill defaults (d = gpus / (t*cp*p); v>1 implies interleaved; zbv implies v=2) and build a Plan."""
    kw = dict(items)
    t, p, cp = kw.get("t", 1), kw.get("p", 1), kw.get("cp", 1)
    check_positive(kw, source, _LAYOUT_KEYS)
    if "d" not in kw:
        if gpus % (t * cp * p):
            what = f"t*cp*p = {t}*{cp}*{p}" if cp > 1 else f"t*p = {t * p}"
            raise PlanError(f"{source}: {what} does not divide the cluster's {gpus} GPUs")
        kw["d"] = gpus // (t * cp * p)
    if kw.get("v", 1) > 1 and "schedule" not in kw:
        kw["schedule"] = "interleaved"
    if kw.get("schedule") == "zbv" and "v" not in kw:
        kw["v"] = 2
    return Plan(**kw)
