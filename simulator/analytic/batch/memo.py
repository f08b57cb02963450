"""The values the batch estimate computes per distinct key, read by the key's field values: one
dictionary per kind of value and the objects it is computed from (by identity), passed to
PlanColumns.per_key as its ``memo``. Made from a model or a GPU profile, it is shared by every
batch of a process (the sizes of a sweep, a search's rank views); made from a cluster (one size),
by that size's batches (its runtime groups)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from simulator.cost.cache import IdentityCache

_MEMOS = IdentityCache(256)


def memo(objs: tuple[Any, ...], kind: Hashable) -> dict:
    """The dictionary of the values of ``kind`` computed from ``objs`` (a model, a GPU profile)."""
    return _MEMOS.get_or_make(objs, kind, dict)
