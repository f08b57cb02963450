"""Predictions of one training iteration: the public API that ``autoplan`` uses.

Layout (docs/design.md section 4), in the order a prediction flows:

* :mod:`simulator.specs`, :mod:`simulator.result` -- what goes in (model, plan, job) and what
  comes out (step time, memory, breakdowns);
* :mod:`simulator.cost` -- pure cost functions, the one home of every rule: the work of a
  layer op by op, op times, parameter counts, memory, collective times, schedules, rank
  layout, per-stage costs and the step's orchestration rules;
* :mod:`simulator.analytic` -- the closed-form estimate over those functions;
* :mod:`simulator.des` -- the discrete-event simulation over the same functions: engine,
  topology, flows, the program of one iteration, memory timeline, attribution, trace, plot.
"""

from __future__ import annotations

from typing import Literal

from hwprofiles.errors import InputError
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan, parse_plan
from simulator.result import SimResult
from simulator.runtime_spec import NO_DP_OVERLAP, OVERLAPPED, Runtime
from simulator.specs import ModelSpec

Fidelity = Literal["des", "analytic"]
FIDELITIES: tuple[Fidelity, ...] = ("des", "analytic")

#: the largest cluster the DES simulates: it builds every node's links, and one iteration of a
#: 7B model on 32,768 GPUs already takes ~8 s and ~0.4 GiB on a 2-core machine (measured
#: 2026-11-24); the analytic estimate has no such limit
DES_MAX_GPUS = 32_768


def check_fidelity(fidelity: Fidelity, gpus: int) -> None:
    """InputError when ``fidelity`` cannot simulate ``gpus`` GPUs (call it before the work)."""
    if fidelity == "des" and gpus > DES_MAX_GPUS:
        raise InputError(
            f"the DES simulates clusters of up to {DES_MAX_GPUS:,} GPUs, this one has {gpus:,}: "
            "give --fidelity analytic (the closed-form estimate)"
        )


__all__ = [
    "DES_MAX_GPUS",
    "FIDELITIES",
    "NO_DP_OVERLAP",
    "OVERLAPPED",
    "Fidelity",
    "Job",
    "ModelSpec",
    "Plan",
    "Runtime",
    "SimResult",
    "check_fidelity",
    "load_model",
    "memory_only",
    "parse_plan",
    "simulate",
]


def simulate(job: Job, fidelity: Fidelity = "des", full: bool = False, trace: bool = False) -> SimResult:
    """Predict one iteration. ``des``: discrete-event simulation (``full``: every rank rather
    than one pipeline by symmetry; ``trace``: also record link utilisation for the Perfetto
    trace); ``analytic``: the closed-form estimate."""
    if fidelity == "analytic":
        from simulator.analytic import estimate

        return estimate(job)
    if fidelity == "des":
        from simulator.des import simulate_des

        check_fidelity(fidelity, job.cluster.num_gpus)
        return simulate_des(job, full=full, trace=trace)
    raise ValueError(f"unknown fidelity {fidelity!r} (expected one of {', '.join(FIDELITIES)})")


def memory_only(job: Job) -> float:
    """Peak bytes of the plan's most loaded rank (closed form; the planner prunes with it)."""
    from simulator.analytic import memory_only as peak

    return peak(job)
