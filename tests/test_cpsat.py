"""autoplan.cpsat: CP-SAT loaded without pandas, its pandas helpers still working afterwards.

Each case runs in a fresh interpreter: whether pandas is imported is process-wide state."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_cp_model_loads_without_pandas_and_solves() -> None:
    out = _python(
        """
        import sys
        from autoplan.cpsat import load_cp_model
        sat = load_cp_model()
        assert sat is sys.modules["ortools.sat.python.cp_model"]
        assert "pandas" not in sys.modules, "pandas imported"
        m = sat.CpModel()
        x = m.new_int_var(0, 10, "x")
        y = m.new_int_var(0, 10, "y")
        m.add(x + 2 * y <= 14)
        m.add(x - y >= -2)
        m.maximize(3 * x + 4 * y)
        solver = sat.CpSolver()
        assert solver.solve(m) == sat.OPTIMAL
        print(int(solver.value(x)), int(solver.value(y)), int(solver.objective_value))
        assert "pandas" not in sys.modules, "pandas imported by solving"
        assert load_cp_model() is sat
        """
    )
    # maximize 3x + 4y with x + 2y <= 14, x - y >= -2, x, y <= 10: x = 10, y = 2 gives 38
    assert out == "10 2 38"


def test_pandas_helpers_work_after_the_deferred_import() -> None:
    pytest.importorskip("pandas")
    out = _python(
        """
        import sys
        from autoplan.cpsat import load_cp_model
        sat = load_cp_model()
        import pandas as pd
        assert sys.modules["pandas"] is not sat.pd and sat.pd.Series is pd.Series
        m = sat.CpModel()
        xs = m.new_int_var_series("x", pd.Index(["a", "b", "c"]), 0, 5)
        m.add(xs.sum() == 7)
        m.minimize(xs["a"] - xs["c"])
        solver = sat.CpSolver()
        assert solver.solve(m) == sat.OPTIMAL
        print(type(xs).__name__, solver.values(xs).to_dict())
        """
    )
    # a + b + c = 7 within 0..5, minimize a - c: a = 0, c = 5, so b = 2 (the only optimum)
    assert out == "Series {'a': 0, 'b': 2, 'c': 5}"


def test_pandas_already_imported_is_used_as_is() -> None:
    pytest.importorskip("pandas")
    out = _python(
        """
        import sys
        import pandas as pd
        from autoplan.cpsat import load_cp_model
        sat = load_cp_model()
        print(sat.pd is pd)
        """
    )
    assert out == "True"
