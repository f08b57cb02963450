"""Steps 4 and 5 of the search: each finalist's CP-SAT layer partition and recomputation map
(:mod:`autoplan.partition`), kept when the analytic model predicts it faster than the uniform
split, then its simulation (DES by default), in the worker pool.
"""

from __future__ import annotations

from typing import Any

from autoplan.partition import optimize_partition
from autoplan.scoring import Scored
from autoplan.workers import SHARED, Pool, progress
from simulator import simulate
from simulator.analytic import estimate
from simulator.job import Job
from simulator.plan import Plan, num_microbatches
from simulator.result import SimResult
from simulator.specs import ModelSpec


def refine_and_simulate_all(
    finalists: list[Scored], global_batch: int, jobs: int, show_progress: bool = False
) -> list[tuple[dict[str, Any] | None, SimResult]]:
    """(partition gain or None, simulation) of each finalist, in the finalists' order. The
    costliest simulations start first (longest-processing-time order balances the workers)."""
    order = sorted(range(len(finalists)), key=lambda i: -_simulation_cost(finalists[i], global_batch))
    bar = progress(len(finalists), show_progress, "refining and simulating finalists", least=1)
    done = []
    with Pool(jobs if len(finalists) > 1 else 1) as pool:
        for x in pool.imap(
            _refine_and_simulate, [(finalists[i].nodes, finalists[i].plan, finalists[i].step_time) for i in order]
        ):
            done.append(x)
            bar.update(1)
    bar.close()
    return [x for _, x in sorted(zip(order, done), key=lambda pair: pair[0])]


def _refine(args: tuple[int, Plan, float]) -> tuple[int, Plan, dict[str, Any] | None]:
    """CP-SAT partition/recompute for one finalist; keeps it when predicted faster."""
    nodes, plan, step = args
    model, B, fix, opts = SHARED["model"], SHARED["B"], SHARED["fix"], SHARED["opts"]
    c = SHARED["clusters"][nodes]
    if not (opts.partition and _worth_partitioning(model, plan, fix)):
        return nodes, plan, None
    job = Job(model, c, plan, B, opts.runtime)
    part = optimize_partition(
        model,
        c,
        plan,
        job.m,
        choose_recompute="recompute" not in fix and "ckpt" not in fix,
        time_limit_s=opts.partition_time_s,
    )
    if part is None:
        return nodes, plan, None
    cand = estimate(Job(model, c, part.plan, B, opts.runtime))
    if not (cand.fits and cand.step_time < step * (1 - 1e-6)):
        return nodes, plan, None
    gain = {
        "uniform": plan.to_string(),
        "optimized": part.plan.to_string(),
        "uniform_step_time_s": step,
        "optimized_step_time_s": cand.step_time,
        "gain_pct": 100 * (1 - cand.step_time / step),
    }
    return nodes, part.plan, gain


def _refine_and_simulate(args: tuple[int, Plan, float]) -> tuple[dict[str, Any] | None, SimResult]:
    """One finalist: CP-SAT refinement (:func:`_refine`), then the simulation of the result."""
    nodes, plan, gain = _refine(args)
    opts = SHARED["opts"]
    result = simulate(Job(SHARED["model"], SHARED["clusters"][nodes], plan, SHARED["B"], opts.runtime), opts.fidelity)
    if not opts.keep_timeline:  # a DES record is megabytes to send back from a worker; plots re-simulate
        result.extra.pop("_des", None)
    return gain, result


def _simulation_cost(s: Scored, global_batch: int) -> float:
    """Relative DES cost of a finalist: its tasks grow with the pipeline's stages x chunks x
    microbatches (one pipeline is simulated, by symmetry)."""
    return s.plan.p * s.plan.v * num_microbatches(s.plan, global_batch)


def _worth_partitioning(model: ModelSpec, plan: Plan, fix: dict[str, Any]) -> bool:
    """The CP-SAT model can help when stages are uneven (p > 1: embedding and head) or when
    recomputation can be chosen per layer (ckpt not none)."""
    if "layers" in fix:
        return False
    return plan.p > 1 or plan.ckpt != "none"
