"""One entry point for predictions: ``simulate(job, fidelity)``."""

from __future__ import annotations

from simulator.result import SimResult
from simulator.specs import Job

FIDELITIES = ("des", "analytic")


def simulate(job: Job, fidelity: str = "des", full: bool = False, trace: bool = False) -> SimResult:
    """Predict one iteration. ``des``: discrete-event simulation (``full``: every rank rather
    than one pipeline by symmetry; ``trace``: also record link utilisation for the Perfetto
    trace); ``analytic``: the closed-form estimate."""
    if fidelity == "analytic":
        from simulator.analytic import estimate

        return estimate(job)
    if fidelity == "des":
        from simulator.des import simulate_des

        return simulate_des(job, full=full, trace=trace)
    raise ValueError(f"unknown fidelity {fidelity!r} (expected one of {', '.join(FIDELITIES)})")
