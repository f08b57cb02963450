"""A framework's plan keys applied to the search's space (autoplan.space): which parallel
layouts (shapes) and which of their option rows the stack runs, by the profile's one set of
rules (:meth:`autoplan.frameworks.Framework.refusals`), with the answers cached per distinct
key (the search asks for the same few tens of thousands of times)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any

from autoplan.frameworks import Framework
from autoplan.space import OPTION_FIELDS, OptionRule, Shape
from simulator.cost.cache import IdentityCache
from simulator.specs import ModelSpec

#: the shape fields the profile's rules read (the rest, d and mb, never change the answer)
_SHAPE_KEYS = ("t", "p", "cp", "ep", "schedule", "sp")
_SHAPE_KEY = attrgetter(*_SHAPE_KEYS)  # a shape's values of them, as one tuple


#: each framework's and model's rules (shape_rule, option_rule), kept: every size of a sweep asks
_RULES = IdentityCache(64)


def shape_rule(fw: Framework, model: ModelSpec) -> Callable[[Shape], bool]:
    """Does ``fw`` run a shape (its layout, before the options); one rule per framework and model."""
    return _RULES.get_or_make((fw, model), "shape", lambda: _shape_rule(fw, model))


def _shape_rule(fw: Framework, model: ModelSpec) -> Callable[[Shape], bool]:
    cache: dict[tuple[Any, ...], bool] = {}

    def runs(shape: Shape) -> bool:
        key = _SHAPE_KEY(shape)
        found = cache.get(key)
        if found is None:
            found = cache[key] = next(fw.refusals(model, dict(zip(_SHAPE_KEYS, key))), None) is None
        return found

    return runs


def option_rule(fw: Framework, model: ModelSpec) -> OptionRule:
    """Does ``fw`` run a shape with an option row (autoplan.space.layout_options' tuples); one
    rule per framework and model."""
    return _RULES.get_or_make((fw, model), "option", lambda: _option_rule(fw, model))


def _option_rule(fw: Framework, model: ModelSpec) -> OptionRule:
    cache: dict[tuple[Any, ...], bool] = {}

    def runs(shape: Shape, row: tuple[Any, ...]) -> bool:
        key = (shape.t, shape.p > 1, shape.cp, shape.ep, *row)
        found = cache.get(key)
        if found is None:
            fields: Mapping[str, Any] = {**shape._asdict(), **dict(zip(OPTION_FIELDS, row))}
            found = cache[key] = next(fw.refusals(model, fields), None) is None
        return found

    return runs


def fix_refusal(fw: Framework, model: ModelSpec, fix: Mapping[str, Any]) -> str | None:
    """Why ``fw`` runs no plan with the pinned keys ``fix`` (--fix), or None. A pinned schedule
    is one of a pipeline (p > 1 unless p is pinned too): one stage runs 1F1B everywhere. Without
    a pinned ZeRO stage the option keys (precision, offload, recomputation...) are checked with
    each stage the stack runs: refused when every one is (``--fix prec=fp8`` under a stack without
    fp8 had been let through to "no valid plan")."""
    pins = dict(fix)
    if "schedule" in pins and "p" not in pins:
        pins["p"] = 2
    if "zero" in pins:
        return next(fw.refusals(model, pins), None)
    why = [next(fw.refusals(model, {**pins, "zero": zero}), None) for zero in fw.runs.zero]
    return None if None in why else why[0]
