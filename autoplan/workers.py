"""What the search's worker processes share: the job's inputs, a fork pool, a progress bar.

The search sets :data:`SHARED` (model, clusters by node count, global batch, pins, options)
before it forks, so each worker reads them instead of receiving them with every task; a plain
in-process map is used for one job or where ``fork`` is not available.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import sys
from collections.abc import Callable, Iterable
from typing import Any

#: the search's inputs, read by the scoring and finalist functions in the workers
SHARED: dict[str, Any] = {}


def can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


class Pool:
    """A fork pool of ``jobs`` workers sharing :data:`SHARED`, or a plain in-process map for one
    job. The workers fork with the parent's objects frozen out of the garbage collector
    (``gc.freeze``, what the gc documentation advises before fork without exec), and run with
    the cyclic collector off (``gc.disable`` as the pool's initializer): a worker lives for one
    phase of one search, and expanding and scoring plans and the DES make no reference cycles
    (tests/test_workers.py), so its collections would only walk the tens of thousands of live
    plan and task records again and again (a tenth of a 1T finalist's DES). Reference counting
    still frees all of it; what stays until the worker exits is OR-tools' ``CpModel``, which
    holds itself in a cycle (about 30 kB per finalist partitioned)."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.pool = None
        if jobs > 1 and can_fork():
            gc.freeze()
            try:
                self.pool = mp.get_context("fork").Pool(jobs, initializer=gc.disable)
            finally:
                gc.unfreeze()

    def imap(self, fn: Callable[[Any], Any], items: list[Any]) -> Iterable[Any]:
        return self.pool.imap(fn, items, chunksize=1) if self.pool else (fn(x) for x in items)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool:
            self.pool.terminate()


class _NoBar:
    def update(self, n: int) -> None: ...
    def close(self) -> None: ...


def progress(total: int, enabled: bool, phase: str, unit: str = "plan", least: int = 20000) -> Any:
    """A tqdm bar on stderr naming the search's ``phase`` and counting ``unit`` when there are
    ``least`` items or more, else a silent one."""
    if not enabled or total < least:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=phase, unit=unit, file=sys.stderr, leave=False, mininterval=0.3)
