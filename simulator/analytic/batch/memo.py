"""The values the batch estimate computes per distinct key, read by the key's field values: one
dictionary per kind of value and the objects it is computed from (by identity), passed to
PlanColumns.per_key as its ``memo``. Made from a model or a GPU profile, it is shared by every
batch of a process (the sizes of a sweep, a search's rank views); made from a cluster (one size),
by that size's batches (its runtime groups)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from hwprofiles.schema import ClusterSpec
from simulator.cost.cache import IdentityCache

_MEMOS = IdentityCache(256)  # from models and GPU profiles: what every size of a sweep shares
_SIZE_MEMOS = IdentityCache(64)  # from a cluster (one size): emptied as a sweep moves on, the others kept


def memo(objs: tuple[Any, ...], kind: Hashable) -> dict:
    """The dictionary of the values of ``kind`` computed from ``objs`` (a model, a GPU profile,
    a cluster)."""
    cache = _SIZE_MEMOS if any(isinstance(o, ClusterSpec) for o in objs) else _MEMOS
    return cache.get_or_make(objs, kind, dict)
