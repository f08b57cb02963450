"""Branch-free helpers over numbers or numpy arrays alike: what lets each cost rule be written once
for the scalar estimate (one plan, Python numbers) and the batch estimate (many plans, arrays).

A rule written with :func:`where`, :func:`maximum` and :func:`minimum` instead of ``if`` and
``max``/``min`` computes, for numbers, exactly what its branches would (the same operations in
the same order, a Python number back) and, for arrays, the same element by element
(``numpy.where``, ``numpy.maximum``, ``numpy.minimum``). numpy is imported only when an array
comes in, so the command line's start-up does not pay for it.
"""

from __future__ import annotations

import math
from typing import Any

#: the types of plain Python numbers: what the scalar estimate passes, checked first (the scalar
#: path calls these helpers hundreds of thousands of times per search)
_NUMBERS = frozenset({int, float, bool})


def _any_array(*values: Any) -> bool:
    """Is any of ``values`` an array (a numpy scalar counts as a number)?"""
    return any(type(v) not in _NUMBERS and getattr(v, "ndim", 0) for v in values)


def where(condition: Any, yes: Any, no: Any) -> Any:
    """``yes if condition else no``, element-wise when any argument is an array. Both sides are
    evaluated by the caller: they must be defined (finite) where they are not chosen."""
    if type(condition) in _NUMBERS and type(yes) in _NUMBERS and type(no) in _NUMBERS:
        return yes if condition else no
    if _any_array(condition, yes, no):
        import numpy as np

        return np.where(condition, yes, no)
    return yes if condition else no


def maximum(a: Any, b: Any) -> Any:
    """``max(a, b)``, element-wise when either is an array."""
    if type(a) in _NUMBERS and type(b) in _NUMBERS:
        return a if a >= b else b
    if _any_array(a, b):
        import numpy as np

        return np.maximum(a, b)
    return a if a >= b else b


def minimum(a: Any, b: Any) -> Any:
    """``min(a, b)``, element-wise when either is an array."""
    if type(a) in _NUMBERS and type(b) in _NUMBERS:
        return a if a <= b else b
    if _any_array(a, b):
        import numpy as np

        return np.minimum(a, b)
    return a if a <= b else b


def negate(condition: Any) -> Any:
    """``not condition``, element-wise for an array of booleans."""
    if type(condition) in _NUMBERS:
        return not condition
    if _any_array(condition):
        import numpy as np

        return np.logical_not(condition)
    return not condition


def any_of(condition: Any) -> bool:
    """Does ``condition`` hold anywhere (a boolean, or any element of an array)? What a rule asks
    before computing a term that only some plans need."""
    if type(condition) in _NUMBERS:
        return bool(condition)
    return bool(condition.any()) if _any_array(condition) else bool(condition)


def fmod(a: Any, b: Any) -> Any:
    """``math.fmod(a, b)``, element-wise when either is an array."""
    if _any_array(a, b):
        import numpy as np

        return np.fmod(a, b)
    return math.fmod(a, b)


def distinct_codes(codes: Any) -> Any:
    """The distinct values of an array of non-negative integer codes, ascending: ``np.unique``'s
    answer by counting (``np.flatnonzero(np.bincount(codes))``). ``np.unique`` asks whether its
    input is a masked array, which imports ``numpy.ma`` (10-20 ms, once in every search worker
    process, measured with ``python -X importtime``, 2026-11-29)."""
    import numpy as np

    return np.flatnonzero(np.bincount(codes))
