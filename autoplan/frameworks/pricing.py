"""The runtime each plan is priced with under a framework (autoplan.frameworks): the profile's,
or for autoplan's own program the one its data-parallel mechanism gives
(autoplan.runtime.support.program_runtime), for one plan or for the search's many."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoplan.frameworks import Framework
from autoplan.runtime.support import DP_MODES, dp_mode, dp_mode_code, program_runtime
from simulator.cost.rank_view import rank_plan
from simulator.plan import Plan
from simulator.plan.table import PlanTable
from simulator.runtime_spec import Runtime


def plan_runtime(fw: Framework | None, runtime: Runtime, plan: Plan, backend: str) -> Runtime:
    """The runtime ``plan`` runs with: ``runtime`` (the profile's, with the command line's
    overrides), through autoplan's program's per-plan rule when ``fw`` is that program."""
    if fw is None or not fw.program:
        return runtime
    return program_runtime(runtime, dp_mode(rank_plan(plan), plan.ep), backend)


def runtime_groups(
    fw: Framework | None, runtime: Runtime, plans: Sequence[Plan], backend: str
) -> list[tuple[Runtime, np.ndarray]]:
    """The plans grouped by the runtime they run with: (runtime, their positions), one group
    when every plan runs with the same. ``plans``: a list or a :class:`PlanTable` (its columns,
    without a Plan per candidate)."""
    if fw is None or not fw.program:
        return [(runtime, np.arange(len(plans)))]
    if isinstance(plans, PlanTable):
        cols = {k: plans.array(k) for k in ("zero", "d", "cp", "offload", "t", "p", "ep")}
    else:
        cols = {k: np.array([getattr(q, k) for q in plans]) for k in ("zero", "d", "cp", "offload", "t", "p", "ep")}
    codes = dp_mode_code(
        cols["zero"], cols["d"] * cols["cp"], cols["offload"] == "cpu", cols["t"], cols["p"], cols["ep"]
    )
    found = np.unique(codes)
    return [(program_runtime(runtime, DP_MODES[int(c)], backend), np.flatnonzero(codes == c)) for c in found]
