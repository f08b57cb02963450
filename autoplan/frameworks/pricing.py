"""The runtime each plan is priced with under a framework (autoplan.frameworks): the profile's,
or for autoplan's own program the one its data-parallel mechanism gives
(autoplan.runtime.support.program_runtime), for one plan or for the search's many."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from autoplan.frameworks import Framework
from autoplan.runtime.support import DP_MODES, dp_mode_code, plan_program_runtime, program_runtime
from simulator.numeric import distinct_codes
from simulator.plan import Plan
from simulator.plan.table import PlanTable
from simulator.runtime_spec import Runtime


def plan_runtime(fw: Framework | None, runtime: Runtime, plan: Plan, backend: str) -> Runtime:
    """The runtime ``plan`` runs with: ``runtime`` (the profile's, with the command line's
    overrides), through autoplan's program's per-plan rule when ``fw`` is that program, or with
    the loss another stack runs at t > 1 (Framework.loss_runtime)."""
    if fw is None:
        return runtime
    if fw.program:
        return plan_program_runtime(runtime, plan, backend)
    return fw.loss_runtime(runtime, plan.t > 1, plan.p > 1)


def runtime_groups(
    fw: Framework | None, runtime: Runtime, plans: PlanTable, backend: str
) -> list[tuple[Runtime, np.ndarray]]:
    """The plans grouped by the runtime they run with: (runtime, their positions), one group
    when every plan runs with the same; read from the table's columns (no Plan per candidate),
    by the rule :func:`plan_runtime` applies to one plan (autoplan.runtime.support.dp_mode_code
    for autoplan's program; the stack's loss at t > 1, with or without a pipeline)."""
    if fw is None or (not fw.program and fw.tensor_parallel_loss is None):
        return [(runtime, np.arange(len(plans)))]
    t, p = plans.array("t"), plans.array("p")
    loss = (t > 1) * (1 + (p > 1))  # 0: t = 1, 1: t > 1 without a pipeline, 2: with one
    if not fw.program:
        return _by_runtime(loss, lambda c: fw.loss_runtime(runtime, c > 0, c == 2))
    col = {k: plans.array(k) for k in ("zero", "d", "cp", "offload", "ep")}
    mode = dp_mode_code(col["zero"], col["d"] * col["cp"], col["offload"] == "cpu", t, p, col["ep"])
    codes = 3 * mode + loss
    return _by_runtime(codes, lambda c: program_runtime(runtime, DP_MODES[c // 3], backend, c % 3 > 0, c % 3 == 2))


def _by_runtime(codes: np.ndarray, runtime_of: Callable[[int], Runtime]) -> list[tuple[Runtime, np.ndarray]]:
    """The plans of each distinct runtime that their ``codes`` give (``runtime_of``), in
    increasing position: codes that give equal runtimes are one group, which the batch estimate
    prices as one part (a runtime names its loss at t = 1 and at t > 1, Runtime.loss, so plans
    of both are one group where the stack's t > 1 loss does not depend on the pipeline, as
    autoplan's program's does not)."""
    same: dict[Runtime, list[int]] = {}
    for c in map(int, distinct_codes(codes)):
        same.setdefault(runtime_of(c), []).append(c)
    return [
        (rt, np.flatnonzero(codes == cs[0]) if len(cs) == 1 else np.flatnonzero(np.isin(codes, cs)))
        for rt, cs in same.items()
    ]
