"""The rule for numbers typed on the command line or in a plan string: ASCII decimal digits.

Python's ``int`` and ``float`` read more than a user means: any Unicode decimal digit (``int("８")``
is 8, so a full-width ``--global-batch ８`` planned a batch of 8), underscores (``1_000``), and for
``float`` the words ``inf``, ``nan`` and ``infinity``. A number here is what the documentation shows:

    integer   [+-]digits                  e.g. 8, 1536, -1
    decimal   [+-]digits[.digits][e[+-]digits], or .digits   e.g. 2e12, 300e9, 0.5, 1.5E-3

with ASCII digits only. Each parser raises ValueError naming what it expected; the callers say
which option or key it came from.
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def parse_integer(text: str) -> int:
    """The integer ``text`` spells (surrounding spaces allowed); ValueError when it spells none."""
    if not _INTEGER.fullmatch(text.strip()):
        raise ValueError(f"expected an integer, got {text!r}")
    return int(text)


def parse_decimal(text: str) -> float:
    """The finite number ``text`` spells (surrounding spaces allowed); ValueError when it spells
    none or when it is too large for a float (``1e999``)."""
    if not _DECIMAL.fullmatch(text.strip()):
        raise ValueError(f"expected a number, got {text!r}")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"expected a number a float can hold, got {text!r}")
    return value
