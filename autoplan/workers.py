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
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
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


#: seconds between two checks for a Ctrl-C the interpreter dropped while the parent waits for a result
WATCH_S = 0.5


def can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


class WorkerDied(AutoplanError):
    """A worker process ended in the middle of the search (killed: the out-of-memory killer, a
    signal); the search stops (exit 1)."""


class Pool:
    """A fork pool of ``jobs`` workers sharing :data:`SHARED`, or a plain in-process map for one
    job. Each worker has a pipe of its own and takes one task at a time from the parent, so the
    workers share no lock. ``multiprocessing.Pool``'s workers share one task queue: a worker
    killed while it waited on it kept the queue's lock, on which ``Pool.terminate`` then waited
    for ever (a worker SIGKILLed at the start of a scoring hung the search, 2 cores,
    2026-11-29), and that pool replaces a lost worker and waits for its task for ever. Here a
    worker that ends while the pool runs is a :class:`WorkerDied` in :meth:`imap`, and leaving
    the ``with`` block kills the workers, idle or busy.

    The workers fork with the parent's objects frozen out of the garbage collector
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
    the pool stands, as at any other moment."""

    def __init__(self, jobs: int):
        self.workers: list[_Worker] = []
        self.closed = False
        if jobs > 1 and can_fork():
            context = mp.get_context("fork")
            gc.freeze()
            try:
                with _sigint_blocked():
                    for _ in range(jobs):
                        ours, theirs = context.Pipe()
                        others = [w.conn for w in self.workers]  # the child closes them: only the parent holds them
                        process = context.Process(target=_serve, args=(theirs, others), daemon=True)
                        process.start()
                        theirs.close()
                        self.workers.append(_Worker(process, ours))
            except BaseException:  # a Ctrl-C held back during the forks, answered on leaving the block
                self.close()
                raise
            finally:
                gc.unfreeze()

    @property
    def forked(self) -> bool:
        """Whether the work runs in worker processes (not in this one)."""
        return bool(self.workers)

    def imap(self, fn: Callable[[Any], Any], items: list[Any], blocks: bool = False) -> Iterable[Any]:
        """``fn`` over ``items`` in order, in the workers: WorkerDied when one of them ends, and an
        exception ``fn`` raised in a worker raised here at its item. Each idle worker is given
        the next item, or with ``blocks`` the next of its own contiguous share of them, and
        when that is done the last of the largest share left (items next to each other that
        share work, as runs of plans of neighbouring layouts do, stay on one worker's warm
        caches). A map left before its end (an exception, a ``break``) kills the workers: a busy
        one's answer would otherwise be taken for the next map's."""
        if self.closed:
            raise RuntimeError("the worker pool is closed")
        if not self.workers:
            return (fn(x) for x in items)
        return self._ordered(fn, items, _Shares(len(items), len(self.workers) if blocks else 1))

    def _ordered(self, fn: Callable[[Any], Any], items: list[Any], shares: _Shares) -> Iterator[Any]:
        """The workers' results for ``items``, in order, each worker given items as ``shares``
        deals them; the parent waits on the workers' pipes and processes, ``WATCH_S`` at a time,
        checking for a Ctrl-C the interpreter dropped (autoplan.interrupt)."""
        done: dict[int, tuple[bool, Any]] = {}
        idle, busy = list(self.workers), {}  # busy: the workers with a task, by their pipes
        wanted = 0
        try:
            while wanted < len(items):
                if wanted in done:
                    ok, value = done.pop(wanted)
                    wanted += 1
                    if not ok:
                        raise value
                    yield value
                    continue
                while idle and shares.left:
                    worker = idle.pop(0)
                    index = shares.deal(self.workers.index(worker))
                    worker.give((fn, items[index]))
                    busy[worker.conn] = (worker, index)
                ready = set(wait([*busy, *(w.process.sentinel for w in self.workers)], timeout=WATCH_S))
                interrupt.check()
                for conn in [c for c in busy if c in ready]:
                    worker, index = busy.pop(conn)
                    done[index] = worker.take()
                    idle.append(worker)
                ended = next((w for w in self.workers if w.process.sentinel in ready), None)
                if ended is not None:
                    raise ended.died()
        finally:
            if busy:  # left before its end (imap's docstring)
                self.close()

    def close(self) -> None:
        """Kill the workers, idle or busy (none holds anything the parent waits on), and reap them."""
        for worker in self.workers:
            worker.conn.close()
            if worker.process.exitcode is None:
                worker.process.kill()
        for worker in self.workers:
            worker.process.join()
        self.workers = []
        self.closed = True

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Shares:
    """Item indexes 0..n-1 dealt to ``k`` workers: worker i first takes, in order, the i-th of k
    contiguous shares (with k = 1, every worker the next item), then the last item of the
    largest share left."""

    def __init__(self, n: int, k: int):
        self.bounds = [[i * n // k, (i + 1) * n // k] for i in range(k)]
        self.left = n

    def deal(self, worker: int) -> int:
        own = self.bounds[worker % len(self.bounds)]
        if own[0] < own[1]:
            own[0] += 1
            self.left -= 1
            return own[0] - 1
        other = max(self.bounds, key=lambda b: b[1] - b[0])
        other[1] -= 1
        self.left -= 1
        return other[1]


@dataclass(frozen=True, eq=False)
class _Worker:
    """A worker process and the parent's end of its pipe."""

    process: BaseProcess
    conn: Connection

    def give(self, task: tuple[Callable[[Any], Any], Any]) -> None:
        try:
            self.conn.send(task)
        except OSError:  # the pipe is broken: the worker ended
            raise self.died() from None

    def take(self) -> tuple[bool, Any]:
        """(True, the result) or (False, the exception) of the task the worker was given."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # it ended before or while answering
            raise self.died() from None

    def died(self) -> WorkerDied:
        """The error of this worker's end, saying how it ended (once the kernel has reaped it)."""
        self.process.join(WATCH_S)
        code = self.process.exitcode or 0
        return WorkerDied(f"a search worker process (pid {self.process.pid}) {_ending(code)}; try fewer --jobs")


def _serve(conn: Connection, others: list[Connection]) -> None:
    """A worker's life: the parent's tasks from ``conn``, one at a time, each answered with
    (True, its result) or (False, the exception it raised, the traceback added as a note),
    until the parent closes its end. ``others``: the pipes of the workers forked before this
    one, which only the parent may hold (so that each worker sees its own pipe close)."""
    for other in others:
        other.close()
    _init_worker()
    while True:
        try:
            fn, item = conn.recv()
        except EOFError:
            return
        try:
            answer: tuple[bool, Any] = (True, fn(item))
        except Exception as exc:
            exc.add_note("in a search worker:\n" + traceback.format_exc())
            answer = (False, exc)
        try:
            conn.send(answer)
        except Exception as exc:  # an answer pickle cannot carry; nothing was written
            conn.send((False, RuntimeError(f"a search worker's answer could not be sent back: {exc!r}")))


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
