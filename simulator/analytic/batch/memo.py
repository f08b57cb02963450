"""The values the batch estimate computes per distinct key that depend on neither the cluster's
size nor the batch: one dictionary per kind of value and the objects it is computed from (by
identity), shared by every batch of a process (the sizes of a sweep, a search's rank views),
passed to PlanColumns.per_key as its ``memo``."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from simulator.cost.cache import IdentityCache

_MEMOS = IdentityCache(256)


def memo(objs: tuple[Any, ...], kind: Hashable) -> dict:
    """The dictionary of the values of ``kind`` computed from ``objs`` (a model, a GPU profile)."""
    return _MEMOS.get_or_make(objs, kind, dict)
