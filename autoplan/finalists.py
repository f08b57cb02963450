"""Steps 4 and 5 of the search: each finalist's layer partition and recomputation map
(:mod:`autoplan.partition`), kept when the analytic model predicts it faster than the uniform
split, then the simulation (DES by default) of each distinct refined plan, in the worker pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from autoplan.cpsat import load_cp_model
from autoplan.frameworks.exports import files_differ
from autoplan.partition import levelled_split, optimize_partition
from autoplan.scoring import Scored
from autoplan.workers import SHARED, Pool, plan_job, progress
from simulator import simulate
from simulator.analytic import estimate
from simulator.des.budget import estimated_events
from simulator.gc_pause import paused_gc
from simulator.plan import Plan
from simulator.result import SimResult


def refine_and_simulate_all(
    finalists: list[Scored], jobs: int, show_progress: bool = False
) -> tuple[list[dict[str, Any]], list[SimResult]]:
    """The partition gains CP-SAT found, and the simulation of each distinct plan the finalists
    refine to, in the finalists' order. Two finalists can refine to one plan (a ckpt=selective
    finalist whose best recomputation map is none is the ckpt=none finalist): it is simulated
    and listed once. CP-SAT runs for every finalist first, then the simulations, the costliest
    first by their estimated DES events (simulator.des.budget; longest-processing-time order
    balances the workers)."""
    args = [(f.nodes, f.plan, f.step_time) for f in finalists]
    analytic = SHARED["opts"].fidelity == "analytic"
    with Pool(jobs if len(finalists) > 1 else 1) as pool:
        refined: list[Refined] = _mapped(pool, _refine, args, show_progress, "refining finalists")
        first: dict[tuple[int, str], int] = {}
        for i, r in enumerate(refined):
            first.setdefault((r.nodes, r.plan.to_string()), i)
        keep = sorted(first.values())
        order = sorted(keep, key=lambda i: -estimated_events(plan_job(refined[i].nodes, refined[i].plan)))
        todo = [i for i in order if not (analytic and refined[i].estimate is not None)]  # refining estimated the rest
        pending = [(refined[i].nodes, refined[i].plan) for i in todo]
        done = _mapped(pool, _simulate, pending, show_progress, "simulating finalists")
    by_index = {i: refined[i].estimate for i in order} | dict(zip(todo, done))
    return [r.gain for r in refined if r.gain], [by_index[i] for i in keep]


class Refined(NamedTuple):
    """A finalist after :func:`_refine`: its nodes, its plan (refined, or the finalist's own), the
    gain refining found (None: none), and the analytic estimate of the refined plan (None where the
    finalist was kept: its score is the batch estimate's)."""

    nodes: int
    plan: Plan
    gain: dict[str, Any] | None
    estimate: SimResult | None


def prepare() -> None:
    """What every finalist's worker would otherwise do first, done once by the search's parent
    process while its workers score the plans, so the finalists' workers, forked later, start
    with it: import CP-SAT (about 0.07 s without pandas: autoplan.cpsat) when the
    search partitions, and build the DES topology of each cluster the finalists may run on
    (tens of milliseconds for thousands of GPUs; simulator.des.simulate.topology_for keeps the
    last four)."""
    opts = SHARED["opts"]
    with paused_gc():  # a topology is tens of thousands of link records
        if opts.partition:
            load_cp_model()
        if opts.fidelity == "des":
            from simulator.des.simulate import topology_for

            for cluster in list(SHARED["clusters"].values())[:4]:
                topology_for(cluster)


def _mapped(pool: Pool, fn: Callable[[Any], Any], items: list[Any], show_progress: bool, phase: str) -> list[Any]:
    """``fn`` over ``items`` in the pool, in order, with a progress bar naming ``phase``."""
    bar = progress(len(items), show_progress, phase, least=1)
    out = []
    for x in pool.imap(fn, items):
        out.append(x)
        bar.update(1)
    bar.close()
    return out


def _refine(args: tuple[int, Plan, float]) -> Refined:
    """CP-SAT partition/recompute for one finalist (for a zero-bubble one, the lightest
    recomputation that fits: :func:`_lighter_recompute`); keeps it when predicted faster."""
    nodes, plan, step = args
    model, fix, opts = SHARED["model"], SHARED["fix"], SHARED["opts"]
    choose_recompute = "ckpt" not in fix
    if opts.partition and plan.split_backward and choose_recompute:
        candidates = _lighter_recompute(plan)
    elif opts.partition and _worth_partitioning(plan):
        candidates = _partitioned(nodes, plan, choose_recompute)
    else:
        candidates = []
    best: tuple[SimResult, Plan] | None = None
    for refined in candidates:
        if opts.framework and (
            opts.framework.refusal(model, refined) or files_differ(opts.framework, plan_job(nodes, refined))
        ):
            continue  # a layer split or recomputation its framework does not run
        cand = estimate(plan_job(nodes, refined))
        if cand.fits and cand.step_time < (best[0].step_time if best else step * (1 - 1e-6)):
            best = (cand, refined)
    if best is None:
        return Refined(nodes, plan, None, None)
    gain = {
        "uniform": plan.to_string(),
        "optimized": best[1].to_string(),
        "uniform_step_time_s": step,
        "optimized_step_time_s": best[0].step_time,
        "gain_pct": 100 * (1 - best[0].step_time / step),
    }
    return Refined(nodes, best[1], gain, best[0])


def _partitioned(nodes: int, plan: Plan, choose_recompute: bool) -> list[Plan]:
    """The plans CP-SAT's layer split and recomputation map make of ``plan``, the levelled split
    first (the same pipeline time as the solver's is kept: ties go to the first). Chunks of one
    layer each (p*v = L) have no other split: with the recomputation pinned nothing is left to
    choose, and otherwise recomputing nothing is fastest, so ``plan`` without recomputation is
    the solver's answer when it fits, found without it (gpt-1t's t=16,p=32,v=4 finalists: 0.08 s
    of CP-SAT each)."""
    if plan.p * plan.v >= SHARED["model"].num_layers:
        if not choose_recompute:
            return []
        lightest = plan.replace(ckpt="none")
        if estimate(plan_job(nodes, lightest)).fits:
            return [lightest]
    part = optimize_partition(plan_job(nodes, plan), choose_recompute, SHARED["opts"].partition_time_s)
    return [] if part is None else [x for x in (levelled_split(part.plan), part.plan) if x is not None]


def _lighter_recompute(plan: Plan) -> list[Plan]:
    """The zero-bubble plan with less recomputation (full -> selective -> none), which CP-SAT, whose
    objective is 1F1B's and the interleaved schedule's, does not choose for it: a recomputing
    finalist whose lighter twin fits refines to it (and is then simulated once, as that twin)."""
    lighter = {"full": ("selective", "none"), "selective": ("none",), "none": ()}[plan.ckpt]
    return [plan.replace(ckpt=ckpt) for ckpt in lighter]


def _simulate(args: tuple[int, Plan]) -> SimResult:
    """The simulation of one refined finalist."""
    opts = SHARED["opts"]
    result = simulate(plan_job(*args), opts.fidelity)
    if not opts.keep_timeline:  # a DES record is megabytes to send back from a worker; plots re-simulate
        result.extra.pop("_des", None)
    return result


def _worth_partitioning(plan: Plan) -> bool:
    """The CP-SAT model can help when stages are uneven (p > 1: embedding and head) or when
    recomputation can be chosen per layer (ckpt not none). Its objective is 1F1B's or the
    interleaved schedule's pipeline time, so zero-bubble plans (whose bubble the weight-gradient
    passes fill; ZB-V's chunks in a V) keep the uniform split. (--fix takes no layer split or
    recomputation map: autoplan.space.parse_fix.)"""
    if plan.split_backward:
        return False
    return plan.p > 1 or plan.ckpt != "none"
