"""The plans of a batch estimate as columns: one array per plan field, read in one pass, and the
grouping of the plans by any subset of their fields (what the batch estimate computes once per
distinct key with the scalar rule that owns it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from simulator.plan import Plan
from simulator.plan.fields import microbatches, replicas_of, shard_group_of
from simulator.plan.table import PlanTable

_INT_FIELDS = ("t", "p", "d", "mb", "sp", "v", "zero", "hsdp", "fp8ag", "cp", "ep")
_OTHER_FIELDS = ("ckpt", "schedule", "offload", "prec", "layers", "recompute")


#: the rows a take keeps: their positions, or a slice (whose columns are views, not copies)
Rows = np.ndarray | slice


def take_rows(values: np.ndarray, rows: Rows) -> np.ndarray:
    """The rows ``rows`` of ``values``: a view for a slice; for positions a copy, by
    ``ndarray.take`` (several times faster than fancy indexing on 2-d arrays)."""
    return values[rows] if isinstance(rows, slice) else values.take(rows, axis=0)


def group_codes(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """(the index of the first element of each distinct value of ``key``, in increasing value; each
    element's index into them), the values being integers in [0, ``bound``): np.unique's
    return_index and return_inverse, counted on a table of the ``bound`` values where it is
    small (ten times faster than np.unique's sort on the search's tens of thousands of plans): the
    values seen, in increasing order, numbered in a table of the ``bound`` values (four times
    faster than numbering them by a cumulative sum over it, at 60,000 plans and 500,000 values)."""
    n = len(key)
    if bound > 16 * n + 1024:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)
    seen = np.zeros(bound, dtype=bool)
    seen[key] = True
    values = np.flatnonzero(seen)
    number = np.empty(bound, dtype=np.int64)
    number[values] = np.arange(len(values))
    inverse = number[key]
    first = np.full(len(values), n, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(n))
    return first, inverse


class PlanColumns:
    """The plans' fields as arrays (one row per plan), read from the plans in one pass (from a
    :class:`~simulator.plan.table.PlanTable`, its columns as they are), and the grouping of the
    plans by any subset of them (:meth:`per_key`)."""

    def __init__(self, plans: Sequence[Plan], global_batch: int):
        self.plans = plans
        n = len(plans)
        self._codes: dict[str, tuple[np.ndarray, int]] = {}  # field -> (each plan's code, distinct codes)
        self._values: dict[str, dict[Any, int]] = {}  # field -> the code of each value
        if isinstance(plans, PlanTable):  # the columns as they are
            self.col = {}
            for name in _INT_FIELDS:
                values, index = plans.column(name)
                self.col[name] = np.array(values, dtype=np.int64)[index]
            for name in _OTHER_FIELDS:
                values, index = plans.column(name)
                self._values[name] = {value: j for j, value in enumerate(values)}
                self._codes[name] = (index, len(values))
        else:
            self.col = {name: np.fromiter(map(attrgetter(name), plans), np.int64, n) for name in _INT_FIELDS}
            for name in _OTHER_FIELDS:
                column = list(map(attrgetter(name), plans))
                code = self._values[name] = {value: j for j, value in enumerate(dict.fromkeys(column))}
                self._codes[name] = (np.fromiter(map(code.__getitem__, column), np.int64, n), len(code))
        self._read: dict[int, Plan] = {}  # the plans read so far, by row (a PlanTable makes each anew)
        self._lists: dict[str, list] | None = None  # _value_lists
        self.col["m"] = microbatches(global_batch, self.col["d"], self.col["mb"])
        self._name_columns()

    def _name_columns(self) -> None:
        c = self.col
        self.t, self.p, self.d, self.v, self.zero, self.fp8ag = c["t"], c["p"], c["d"], c["v"], c["zero"], c["fp8ag"]
        self.m = c["m"]
        self.shard_group = shard_group_of(c["hsdp"], self.d)  # the rank view's grad group: d
        self.replicas = replicas_of(self.d, self.shard_group)

    def take(self, rows: Rows) -> PlanColumns:
        """The columns of the plans of ``rows``, in that order (their codes kept)."""
        sub = object.__new__(PlanColumns)
        plans = self.plans
        if isinstance(plans, PlanTable):
            sub.plans = plans.take(rows)
        else:
            sub.plans = list(plans[rows]) if isinstance(rows, slice) else [plans[i] for i in rows.tolist()]
        sub.col = {name: take_rows(values, rows) for name, values in self.col.items()}
        sub._codes = {name: (take_rows(code, rows), n) for name, (code, n) in self._codes.items()}
        sub._values = self._values
        sub._lists = self._lists
        sub._read = {}
        sub._name_columns()
        return sub

    def is_(self, name: str, value: Any) -> np.ndarray:
        """Which plans have ``value`` in the (non-integer) field ``name``."""
        code = self._values[name].get(value)
        return self._codes[name][0] == code if code is not None else np.zeros(len(self.plans), dtype=bool)

    def _code(self, name: str) -> tuple[np.ndarray, int]:
        if name not in self._codes:
            column = self.col[name]
            first, inverse = group_codes(column, int(column.max()) + 1 if len(column) else 0)
            self._codes[name] = (inverse, len(first))
        return self._codes[name]

    def per_key(
        self, names: Sequence[str], value: Callable[[Plan, int], Any], memo: dict | None = None
    ) -> tuple[list, np.ndarray]:
        """(``value(plan, i)`` of each distinct combination of the fields ``names``, for i the
        first plan that has it; the index of each plan's combination in that list). ``memo``: the
        values found before, by the fields' values (a dictionary shared by every batch whose
        ``value`` gives the same for the same fields: the sizes of a sweep, the rank views of a
        search), read first and filled with what is new."""
        return self.per_row_key(names, lambda i: value(self.plan(i), i), memo)

    def per_row_key(
        self, names: Sequence[str], value: Callable[[int], Any], memo: dict | None = None
    ) -> tuple[list, np.ndarray]:
        """:meth:`per_key` of a ``value`` that reads the plan of row i from the columns
        (:meth:`value_of`), no :class:`Plan` made."""
        first, inverse = group_codes(*self.key_codes(names))
        if memo is None:
            return [value(i) for i in first.tolist()], inverse
        found = []
        for i, fields in zip(first.tolist(), self._field_values(names, first)):
            hit = memo.get(fields, memo)  # the memo itself: not found (no value is the memo)
            if hit is memo:
                hit = memo[fields] = value(i)
            found.append(hit)
        return found, inverse

    def distinct(self, names: Sequence[str]) -> tuple[list[tuple], np.ndarray, np.ndarray]:
        """(each distinct combination of the fields ``names``, as a tuple of their values; the first
        plan that has it; the index of each plan's combination in that list)."""
        first, inverse = group_codes(*self.key_codes(names))
        return self._field_values(names, first), first, inverse

    def key_codes(self, names: Sequence[str], rows: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """(the code of each plan's combination of the fields ``names``, of the plans of ``rows``
        (None: of all); the number of codes): the fields' codes as the digits of a mixed-radix
        number (fewer than 2**63 combinations)."""
        key = np.zeros(len(self.plans) if rows is None else len(rows), dtype=np.int64)
        combinations = 1
        for name in names:
            code, n = self._code(name)
            key = key * n + (code if rows is None else code[rows])
            combinations *= n
        return key, combinations

    def _field_values(self, names: Sequence[str], rows: np.ndarray) -> list[tuple]:
        """The values of the fields ``names`` of the plans of ``rows``, a tuple per plan."""
        columns = []
        for name in names:
            if name in self._values:  # coded: the values in the order of their codes
                values = self._value_lists()[name]
                columns.append([values[c] for c in self._codes[name][0][rows].tolist()])
            else:
                columns.append(self.col[name][rows].tolist())
        return list(zip(*columns))

    def ints(self, names: Sequence[str], i: int) -> tuple[int, ...]:
        """The integer fields ``names`` of the plan of row ``i``, read from their columns."""
        return tuple(int(self.col[name][i]) for name in names)

    def value_of(self, name: str, i: int) -> Any:
        """The field ``name`` of the plan of row ``i``, read from its column."""
        if name in self._values:
            return self._value_lists()[name][int(self._codes[name][0][i])]
        return int(self.col[name][i])

    def _value_lists(self) -> dict[str, list]:
        """Each coded field's values in the order of their codes (made once)."""
        if self._lists is None:
            self._lists = {name: list(values) for name, values in self._values.items()}
        return self._lists

    def plan(self, i: int) -> Plan:
        """The plan of row ``i``, made once (the keys' first rows repeat across groupings)."""
        found = self._read.get(i)
        if found is None:
            found = self._read[i] = self.plans[i]
        return found

    def per_plan(
        self, names: Sequence[str], value: Callable[[Plan, int], float], memo: dict | None = None
    ) -> np.ndarray:
        """:meth:`per_key`'s values put back in the plans' order (a float per plan)."""
        values, inverse = self.per_key(names, value, memo)
        return np.array(values, dtype=float)[inverse]

    def per_row(self, names: Sequence[str], value: Callable[[int], float], memo: dict | None = None) -> np.ndarray:
        """:meth:`per_row_key`'s values put back in the plans' order (a float per plan)."""
        values, inverse = self.per_row_key(names, value, memo)
        return np.array(values, dtype=float)[inverse]
