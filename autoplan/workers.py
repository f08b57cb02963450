"""What the search's worker processes share: the job's inputs, a fork pool, a progress bar.

The search sets :data:`SHARED` (model, clusters by node count, global batch, pins, options)
before it forks, so each worker reads them instead of receiving them with every task; a plain
in-process map is used for one job or where ``fork`` is not available.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any

from autoplan import interrupt
from autoplan.frameworks.pricing import plan_runtime
from hwprofiles.errors import AutoplanError
from simulator.job import Job
from simulator.plan import Plan

#: the search's inputs, read by the scoring and finalist functions in the workers
SHARED: dict[str, Any] = {}


def plan_job(nodes: int, plan: Plan) -> Job:
    """The job of ``plan`` on ``nodes`` nodes from the search's inputs (:data:`SHARED`), with the
    runtime its framework runs it with (autoplan.frameworks.pricing.plan_runtime)."""
    opts, cluster = SHARED["opts"], SHARED["clusters"][nodes]
    runtime = plan_runtime(opts.framework, opts.base_runtime, plan, cluster.node.backend)
    return Job(SHARED["model"], cluster, plan, SHARED["B"], runtime)


#: seconds between two checks that the workers are alive while the parent waits for a result
WATCH_S = 0.5


def can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


class WorkerDied(AutoplanError):
    """A worker process ended in the middle of the search (killed: the out-of-memory killer, a
    signal); the pool would wait for its task forever, so the search stops (exit 1)."""


class Pool:
    """A fork pool of ``jobs`` workers sharing :data:`SHARED`, or a plain in-process map for one
    job. The workers fork with the parent's objects frozen out of the garbage collector
    (``gc.freeze``, what the gc documentation advises before fork without exec), and run with
    the cyclic collector off (``gc.disable`` in :func:`_init_worker`): a worker lives for one
    phase of one search, and expanding and scoring plans and the DES make no reference cycles
    (tests/test_workers.py), so its collections would only walk the tens of thousands of live
    plan and task records again and again (a tenth of a 1T finalist's DES). Reference counting
    still frees all of it; what stays until the worker exits is OR-tools' ``CpModel``, which
    holds itself in a cycle (about 30 kB per finalist partitioned).

    The workers ignore SIGINT: Ctrl-C reaches the whole foreground process group, and only the
    parent answers it (a KeyboardInterrupt; leaving the ``with`` block ends the workers). SIGINT
    is blocked while the pool forks (:func:`_sigint_blocked`), so a Ctrl-C then is answered once
    the pool stands, as at any other moment. A worker that ends while the pool runs
    (``multiprocessing.Pool`` would start another and wait for the lost task forever) is a
    :class:`WorkerDied` in :meth:`imap`."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.pool = None
        self.workers: list[BaseProcess] = []
        if jobs > 1 and can_fork():
            before = set(mp.active_children())
            gc.freeze()
            try:
                with _sigint_blocked():
                    self.pool = mp.get_context("fork").Pool(jobs, initializer=_init_worker)
                    self.workers = [w for w in mp.active_children() if w not in before]
            except BaseException:  # a Ctrl-C held back during the fork, answered on leaving the block
                if self.pool is not None:
                    self.pool.terminate()
                raise
            finally:
                gc.unfreeze()

    def imap(self, fn: Callable[[Any], Any], items: list[Any]) -> Iterable[Any]:
        """``fn`` over ``items`` in order, in the workers (WorkerDied when one of them ends)."""
        if self.pool is None:
            return (fn(x) for x in items)
        return self._watched(self.pool.imap(fn, items, chunksize=1))

    def _watched(self, results: Any) -> Iterator[Any]:
        """``results`` (an imap iterator), checking the workers while waiting for the next one."""
        while True:
            try:
                yield results.next(timeout=WATCH_S)
            except StopIteration:
                return
            except mp.TimeoutError:
                self._check_workers()
            interrupt.check()  # a Ctrl-C the interpreter dropped (autoplan.interrupt)

    def _check_workers(self) -> None:
        """WorkerDied when a worker has ended, saying how."""
        dead = next((w for w in self.workers if w.exitcode is not None), None)
        if dead is not None:
            raise WorkerDied(
                f"a search worker process (pid {dead.pid}) {_ending(dead.exitcode or 0)}; try fewer --jobs"
            )

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool:
            self.pool.terminate()


def _ending(code: int) -> str:
    """How a process with exit code ``code`` ended (negative: killed by that signal)."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was killed by {name}" + (" (the out-of-memory killer?)" if code == -signal.SIGKILL else "")


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT held back (blocked, not lost) for the ``with`` block, then delivered if it came.

    A Ctrl-C that lands while the parent forks its workers raises its KeyboardInterrupt inside
    one of the interpreter's at-fork callbacks, which prints "Exception ignored in ...
    _releaseLock" and goes on: the search ended with exit 0 (seen on 2 cores, 2026-11-29, by
    sending SIGINT at random moments of a search); and a worker forked then would get it before
    its initializer ignores SIGINT. A child inherits the blocked mask; the worker's initializer
    ignores SIGINT before it unblocks it (:func:`_init_worker`). The pool's handler threads,
    started inside the block, keep SIGINT blocked; Python runs the handler in the main thread
    whichever thread the kernel delivers the signal to."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _init_worker() -> None:
    """A worker's start: the cyclic garbage collector off, SIGINT ignored, then unblocked: a
    Ctrl-C held back during the fork is dropped here (:func:`_sigint_blocked`; only the parent
    answers it)."""
    gc.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


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
