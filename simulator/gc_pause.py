"""Pausing Python's cyclic garbage collector around allocation-heavy work.

The DES builds and runs tens of thousands of task records, and a search worker expands tens
of thousands of plans: every 700 allocations CPython runs a young-generation collection, and
every few of those an older one that walks all live objects (with OR-tools, pandas and pydantic
loaded, hundreds of thousands), though this work makes no reference cycles to reclaim. Paused,
a 1T-parameter DES iteration runs about a fifth faster. Reference counting still frees every
object that becomes unreachable; the collector resumes (when it was on) afterwards and takes
any cycles then.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector off for the ``with`` block, then back as it was."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
