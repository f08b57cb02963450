"""OR-tools CP-SAT's Python API (``ortools.sat.python.cp_model``), loaded without pandas.

``cp_model`` imports pandas at module level for its pandas helpers alone: the ``*_series``
variable makers and ``CpSolver.values``/``boolean_values``/``float_values`` over a
``pd.Index`` (ortools 9.15, ``ortools/sat/python/cp_model.py``: every ``pd.`` outside those is
the module-level type alias ``_IndexOrSeries = Union[pd.Index, pd.Series]``). autoplan's
partitioner uses none of them, yet importing pandas (and pyarrow, which pandas imports when it
is installed) was most of the cost of loading CP-SAT: 0.28-0.31 s of CPU with pandas, 0.06-0.08 s
without (measured 2026-11-26 on the 2-core CI-like VM), a seventh of the main job's CPU time.

:func:`load_cp_model` imports ``cp_model`` with a stand-in ``pandas`` module in ``sys.modules``
for the duration of that one import. During it the stand-in answers ``Index`` and ``Series``
(the alias) with placeholder classes; afterwards it forwards every attribute to the real
pandas, imported then, so the pandas helpers still work for anyone who calls them, paying the
import at their first use. Where pandas is already imported, or where an OR-tools release reads
more of pandas at import than the alias, ``cp_model`` is imported the ordinary way. (A thread
that imports pandas for the first time during those 0.07 s would get the stand-in, which answers
nothing but the alias until the import is over; the search's threads import no pandas.)
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

CP_MODEL = "ortools.sat.python.cp_model"
_lock = threading.Lock()


class _DeferredPandas(types.ModuleType):
    """``pandas`` as ``cp_model`` sees it: placeholders for its import-time alias, then the real
    module behind every attribute."""

    def __init__(self) -> None:
        super().__init__("pandas", "stand-in for pandas while ortools' cp_model is imported (autoplan.cpsat)")
        self.importing = True

    def __getattr__(self, name: str) -> Any:
        if self.importing:
            if name in ("Index", "Series"):  # Union[pd.Index, pd.Series]: a type alias, nothing is an instance
                return type(name, (), {"__module__": "autoplan.cpsat"})
            raise AttributeError(f"pandas.{name} read while cp_model was being imported")
        return getattr(importlib.import_module("pandas"), name)


def load_cp_model() -> types.ModuleType:
    """``ortools.sat.python.cp_model``, imported (once) without importing pandas (module docstring)."""
    loaded = sys.modules.get(CP_MODEL)
    if loaded is not None:
        return loaded
    with _lock:  # one import at a time: the stand-in must not be seen by another thread's import
        if CP_MODEL in sys.modules or "pandas" in sys.modules:
            return importlib.import_module(CP_MODEL)
        stand_in = _DeferredPandas()
        sys.modules["pandas"] = stand_in
        try:
            return importlib.import_module(CP_MODEL)
        except AttributeError:  # a release that reads more of pandas at import: import it with pandas
            sys.modules.pop(CP_MODEL, None)
            sys.modules.pop("pandas", None)
            return importlib.import_module(CP_MODEL)
        finally:
            stand_in.importing = False
            if sys.modules.get("pandas") is stand_in:
                del sys.modules["pandas"]
