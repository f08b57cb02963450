"""The command line's diagnostics: its packages' loggers, plain messages on stderr."""

from __future__ import annotations

import logging
import sys


class _StderrHandler(logging.StreamHandler):
    """A handler on the ``sys.stderr`` of the moment (a caller or a test may have replaced it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


#: the packages whose diagnostics the command line shows (third-party loggers are left alone)
LOGGERS = ("autoplan", "hwprofiles", "simulator", "benchmarks")


def configure(level: int = logging.INFO) -> None:
    """Plain messages (``%(message)s``) of our packages' loggers on stderr, at ``level``.
    Idempotent: a second call only changes the level."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
