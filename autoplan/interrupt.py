"""Ctrl-C on the command line: one line ``autoplan: error: interrupted``, exit status 130, at
whatever moment it comes.

Python answers SIGINT with a KeyboardInterrupt in the main thread, which the command line
catches. Three moments escape that (each seen on 2 cores, 2026-11-29, by sending SIGINT at
random moments of ``autoplan plan``):

* raised inside a callback whose exceptions the interpreter reports and drops (an at-fork
  handler, an import lock's weakref callback: "Exception ignored in ..."), the interrupt is
  lost and the command ends with exit 0. :func:`install` records every SIGINT, so a command
  that returns afterwards still ends as interrupted, and :func:`check` lets long loops stop;
* raised out of an ``exec`` (dataclasses build their methods with it, during an import),
  CPython 3.11 marks the interrupt unhandled even once caught, and the process then kills
  itself with SIGINT at exit instead of exiting 130. :func:`leave` exits at once, skipping
  the interpreter's finalization (and with it the finalizers of the libraries' threads and
  pools);
* raised while the command line's modules load, before any handler: the entry point
  (:mod:`autoplan.__main__`) loads them inside one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import NoReturn

#: the exit status of an interrupted command (128 + SIGINT, what a shell reports)
EXIT_INTERRUPTED = 128 + signal.SIGINT

_interrupted = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


def install() -> None:
    """Record every SIGINT before raising the KeyboardInterrupt (from the main thread; where
    SIGINT is ignored, as in a background job, it stays ignored)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_sigint)


def interrupted() -> bool:
    """Whether a SIGINT came since :func:`install`."""
    return _interrupted.is_set()


def check() -> None:
    """A KeyboardInterrupt if a SIGINT came whose own was dropped (module docstring)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


def report() -> int:
    """Say the command was interrupted (one line on stderr); its exit status."""
    print("autoplan: error: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def leave(code: int) -> NoReturn:
    """Flush stdout and stderr and exit with ``code`` at once (module docstring)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing to save
            stream.flush()
    os._exit(code)
