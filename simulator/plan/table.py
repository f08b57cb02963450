"""Many plans as a factored table: the search's candidates without a :class:`Plan` object each.

The search's candidates are every parallel layout (t, p, d, mb, sp, schedule, v, cp, ep) with
each memory and precision option its layout allows (prec, zero, ckpt, offload, hsdp, fp8ag):
tens of thousands of plans from a few thousand layouts and a few dozen options. A
:class:`PlanTable` keeps each factor's distinct rows once and, per plan, the index of its row
in every factor. The analytic model over arrays reads its columns
(:meth:`PlanTable.column`, ``simulator.analytic.batch``); a :class:`Plan` is made only for a
plan someone reads (``table[i]``: the search makes them for the few plans it keeps). Making a
frozen dataclass per candidate was a third of the scoring's CPU time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from simulator.numeric import distinct_codes
from simulator.plan.fields import Plan

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Plan)}


@dataclass(frozen=True)
class Factor:
    """Some of the plans' fields: their distinct value ``rows`` (one tuple per row, in ``names``
    order) and, per plan, the row it has (``index``)."""

    names: tuple[str, ...]
    rows: Sequence[tuple[Any, ...]]
    index: np.ndarray
    #: per field, (its distinct values, each row's index into them): read once per ``rows``,
    #: shared with the factors :meth:`PlanTable.take` makes (a size's runtime groups read each)
    codes: dict[str, tuple[list[Any], np.ndarray]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        unknown = set(self.names) - set(_DEFAULTS)
        if unknown:
            raise ValueError(f"not plan fields: {sorted(unknown)}")


class PlanTable(Sequence[Plan]):
    """Plans as factors: plan i has, for each factor, the fields of the factor's row
    ``index[i]``, and the :class:`Plan` default for any field no factor names."""

    def __init__(self, factors: Sequence[Factor]):
        names = [name for f in factors for name in f.names]
        if len(names) != len(set(names)):
            raise ValueError(f"a field in two factors: {names}")
        if len({len(f.index) for f in factors}) > 1:
            raise ValueError("factors of different lengths")
        self.factors = tuple(factors)
        self._length = len(factors[0].index) if factors else 0

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, i: int) -> Plan: ...
    @overload
    def __getitem__(self, i: slice) -> list[Plan]: ...
    def __getitem__(self, i: int | slice) -> Plan | list[Plan]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._length))]
        if not -self._length <= i < self._length:
            raise IndexError(i)
        fields: dict[str, Any] = {}
        for f in self.factors:
            fields.update(zip(f.names, f.rows[int(f.index[i])]))
        return Plan(**fields)

    def column(self, name: str) -> tuple[list[Any], np.ndarray]:
        """(the distinct values of the field ``name``, each plan's index into them)."""
        for f in self.factors:
            if name in f.names:
                found = f.codes.get(name)
                if found is None:
                    k = f.names.index(name)
                    per_row = [row[k] for row in f.rows]
                    code = {value: j for j, value in enumerate(dict.fromkeys(per_row))}
                    found = f.codes[name] = (list(code), np.array([code[v] for v in per_row], dtype=np.int64))
                values, of_row = found
                return list(values), of_row[f.index]
        return [_DEFAULTS[name]], np.zeros(self._length, dtype=np.int64)

    def take(self, rows: np.ndarray | slice) -> PlanTable:
        """The plans at positions ``rows`` (an integer array, or a slice), in that order."""
        return PlanTable([Factor(f.names, f.rows, f.index[rows], f.codes) for f in self.factors])

    def array(self, name: str) -> np.ndarray:
        """Each plan's value of the field ``name``, as one array."""
        values, index = self.column(name)
        return np.asarray(values)[index]

    def values(self, name: str) -> list[Any]:
        """The values the field ``name`` takes in some plan (in no set order)."""
        values, index = self.column(name)
        return [values[j] for j in distinct_codes(index).tolist()]
