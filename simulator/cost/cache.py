"""A bounded cache keyed by object identity (plus plain values) for the estimator's hot path.

Frozen pydantic models hash all their fields on every lookup (microseconds each, thousands
of times per second in the search); keying by ``id`` is free, and holding the objects in the
entry guarantees an id is not reused while its entry lives.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from operator import is_
from typing import Any


class IdentityCache:
    def __init__(self, limit: int = 8192):
        self._d: dict[tuple, tuple[tuple[Any, ...], Any]] = {}
        self._limit = limit

    def get_or_make(self, objs: tuple[Any, ...], rest: Hashable, make: Callable[[], Any]) -> Any:
        """The cached value for (objs by identity, rest), computing it with ``make`` once."""
        key = (*map(id, objs), rest)
        hit = self._d.get(key)
        if hit is not None and all(map(is_, hit[0], objs)):
            return hit[1]
        value = make()
        if len(self._d) >= self._limit:
            self._d.clear()
        self._d[key] = (objs, value)
        return value
