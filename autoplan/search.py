"""The search driver behind ``autoplan plan`` (docs/design.md section 5).

1. enumerate every valid plan (``autoplan.space``) under the ``--fix`` pins;
2. estimate each with the analytic model (memory and time), in ``--jobs`` processes;
3. keep the feasible ones, rank them by the objective, take the top K plus everything within
   ``tolerance`` of the best;
4. give each of those the CP-SAT layer partition and recomputation map (``autoplan.partition``)
   and keep it when it is predicted faster than the uniform split;
5. simulate the finalists with the DES and return the best, the top K and the
   time-vs-memory Pareto set of all feasible plans.
With ``--objective cost`` the search also tries smaller node counts (halving), since fewer GPUs
at a longer step can cost fewer GPU-hours per million tokens.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autoplan import space
from autoplan.partition import optimize_partition
from hwprofiles.errors import FitError, PlanError
from hwprofiles.schema import ClusterSpec
from hwprofiles.units import GiB
from simulator import simulate
from simulator.analytic import estimate, memory_only
from simulator.job import OVERLAPPED, Job, Runtime
from simulator.plan import Plan, num_microbatches
from simulator.result import SimResult
from simulator.specs import ModelSpec

log = logging.getLogger(__name__)


class NoPlanFits(FitError):
    """No plan fits in memory; the message says what the smallest plan needed and what would help
    (a :class:`FitError`: exit 3 on the command line)."""


@dataclass(frozen=True)
class SearchOptions:
    fix: str = ""
    top: int = 8
    jobs: int = 1
    objective: str = "time"  # time | cost
    fidelity: str = "des"  # how the finalists are simulated
    progress: bool = False
    tolerance: float = 0.02  # finalists: top K plus plans within this fraction of the best
    max_finalists: int = 16
    partition: bool = True
    partition_time_s: float = 0.5  # CP-SAT time limit per finalist
    runtime: Runtime = OVERLAPPED  # how the program reduces gradients (see simulator.specs.Runtime)
    keep_timeline: bool = False  # keep each finalist's DES record (for plots and traces; megabytes each)


@dataclass
class Scored:
    """A plan's analytic score: step time, peak memory, fits."""

    plan: Plan
    nodes: int
    step_time: float
    peak_memory: float
    fits: bool


@dataclass
class SearchResult:
    best_result: SimResult
    top: list[SimResult]
    pareto: list[dict[str, Any]]
    candidates_total: int
    candidates_feasible: int
    candidates_simulated: int
    search_time_s: float
    objective: str
    partition_gains: list[dict[str, Any]] = field(default_factory=list)

    def entry(self, r: SimResult) -> dict[str, Any]:
        d = r.to_dict()
        d["cost_gpu_hours_per_mtok"] = cost_per_mtok(r)
        d["plan_string"] = r.job.plan.to_string()
        return d

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.entry(self.best_result),
            "top": [self.entry(r) for r in self.top],
            "pareto": self.pareto,
            "partition": self.partition_gains,
            "objective": self.objective,
            "candidates_total": self.candidates_total,
            "candidates_feasible": self.candidates_feasible,
            "candidates_simulated": self.candidates_simulated,
            "search_time_s": self.search_time_s,
        }


def cost_per_mtok(r: SimResult) -> float:
    """GPU-hours per million tokens: GPUs * step / 3600 / (tokens per step / 1e6)."""
    tokens = r.job.global_batch * r.job.seq
    return r.job.cluster.num_gpus * r.step_time / 3600.0 / (tokens / 1e6)


# ------------------------------------------------------------------- parallel scoring

_WORK: dict[str, Any] = {}


def _score_chunk(args: tuple[int, Sequence[Plan]]) -> list[tuple[float, float, bool]]:
    nodes, plans = args
    model, B = _WORK["model"], _WORK["B"]
    cluster = _WORK["clusters"][nodes]
    cap = cluster.gpu.usable_memory_bytes
    out = []
    for plan in plans:
        job = Job(model, cluster, plan, B, _WORK["opts"].runtime)
        peak = memory_only(job)  # memory first: most plans stop here
        if peak > cap:
            out.append((math.inf, peak, False))
            continue
        r = estimate(job)
        out.append((r.step_time, r.peak_memory, r.fits))
    return out


def _score_all(
    model: ModelSpec, clusters: dict[int, ClusterSpec], B: int, todo: list[tuple[int, Plan]], jobs: int, progress: bool
) -> list[Scored]:
    _WORK.update(model=model, clusters=clusters, B=B)
    chunk = 2000
    batches: list[tuple[int, list[Plan]]] = []
    for nodes in sorted({n for n, _ in todo}):
        plans = [p for n, p in todo if n == nodes]
        batches += [(nodes, plans[i : i + chunk]) for i in range(0, len(plans), chunk)]
    bar = _progress(len(todo), progress)
    results: list[list[tuple[float, float, bool]]]
    if jobs > 1 and len(todo) > 4 * chunk and "fork" in mp.get_all_start_methods():
        with mp.get_context("fork").Pool(jobs) as pool:
            results = []
            for res in pool.imap(_score_chunk, batches):
                results.append(res)
                bar.update(len(res))
    else:
        results = []
        for b in batches:
            results.append(_score_chunk(b))
            bar.update(len(b[1]))
    bar.close()
    scored = []
    for (nodes, plans), res in zip(batches, results):
        scored += [Scored(p, nodes, *r) for p, r in zip(plans, res)]
    return scored


class _NoBar:
    def update(self, n: int) -> None: ...
    def close(self) -> None: ...


def _progress(total: int, enabled: bool):
    if not enabled or total < 20000:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="estimating plans", unit="plan", file=sys.stderr, leave=False, mininterval=0.3)


# -------------------------------------------------------------------------- search


def _node_counts(cluster: ClusterSpec, objective: str) -> list[int]:
    if objective != "cost":
        return [cluster.nodes]
    counts, n = [], cluster.nodes
    while n >= 1:
        counts.append(n)
        n //= 2
    return counts


def _objective(s: Scored | SimResult, objective: str, gpus_per_node: int) -> float:
    if isinstance(s, SimResult):
        return cost_per_mtok(s) if objective == "cost" else s.step_time
    return s.step_time * s.nodes * gpus_per_node if objective == "cost" else s.step_time


def search(model: ModelSpec, cluster: ClusterSpec, global_batch: int, opts: SearchOptions) -> SearchResult:
    t0 = time.perf_counter()
    fix = space.parse_fix(opts.fix)
    gpn = cluster.gpus_per_node
    clusters = {
        n: (cluster if n == cluster.nodes else cluster.model_copy(update={"nodes": n}))
        for n in _node_counts(cluster, opts.objective)
    }
    todo = [(n, p) for n, c in clusters.items() for p in space.enumerate_plans(model, c.num_gpus, global_batch, fix)]
    if not todo:
        raise PlanError(space.explain_empty(model, cluster.num_gpus, global_batch, fix))

    _WORK.update(fix=fix, opts=opts)
    scored = _score_all(model, clusters, global_batch, todo, opts.jobs, opts.progress)
    feasible = [s for s in scored if s.fits]
    log.debug(
        "search: %d candidate plans on %s nodes, %d fit in memory",
        len(todo),
        "/".join(map(str, clusters)),
        len(feasible),
    )
    if not feasible:
        raise NoPlanFits(_no_fit_message(model, cluster, global_batch, scored, fix))
    feasible.sort(key=lambda s: _objective(s, opts.objective, gpn))
    best_val = _objective(feasible[0], opts.objective, gpn)
    finalists = [
        s
        for i, s in enumerate(feasible)
        if i < opts.top or _objective(s, opts.objective, gpn) <= best_val * (1 + opts.tolerance)
    ][: max(opts.top, opts.max_finalists)]

    # CP-SAT partition / recompute, then the DES, of each finalist in the worker pool; the
    # costliest simulations first (longest-processing-time order balances the workers)
    order = sorted(range(len(finalists)), key=lambda i: -_simulation_cost(finalists[i], global_batch))
    log.debug("search: refining and simulating %d finalists (fidelity %s)", len(finalists), opts.fidelity)
    with _Pool(opts.jobs if len(finalists) > 1 else 1) as pool:
        done = pool.map(
            _refine_and_simulate, [(finalists[i].nodes, finalists[i].plan, finalists[i].step_time) for i in order]
        )
    in_rank_order = [x for _, x in sorted(zip(order, done), key=lambda pair: pair[0])]
    gains = [g for g, _ in in_rank_order if g]
    simulated = [r for _, r in in_rank_order]
    fitting = [r for r in simulated if r.fits] or simulated
    fitting.sort(key=lambda r: _objective(r, opts.objective, gpn))
    return SearchResult(
        best_result=fitting[0],
        top=fitting[: opts.top],
        pareto=_pareto(feasible, gpn),
        candidates_total=len(todo),
        candidates_feasible=len(feasible),
        candidates_simulated=len(simulated),
        search_time_s=time.perf_counter() - t0,
        objective=opts.objective,
        partition_gains=gains,
    )


class _Pool:
    """A fork pool of ``jobs`` workers sharing _WORK, or plain in-process map for one job."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.pool = mp.get_context("fork").Pool(jobs) if jobs > 1 and "fork" in mp.get_all_start_methods() else None

    def map(self, fn, items):
        return self.pool.map(fn, items, chunksize=1) if self.pool else [fn(x) for x in items]

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool:
            self.pool.terminate()


def _refine(args: tuple[int, Plan, float]) -> tuple[int, Plan, dict[str, Any] | None]:
    """CP-SAT partition/recompute for one finalist; keeps it when predicted faster."""
    nodes, plan, step = args
    model, B, fix, opts = _WORK["model"], _WORK["B"], _WORK["fix"], _WORK["opts"]
    c = _WORK["clusters"][nodes]
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
    opts = _WORK["opts"]
    result = simulate(Job(_WORK["model"], _WORK["clusters"][nodes], plan, _WORK["B"], opts.runtime), opts.fidelity)
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


def _pareto(feasible: list[Scored], gpn: int, limit: int = 12) -> list[dict[str, Any]]:
    """Plans no other plan beats in both step time and peak memory (fastest first)."""
    front: list[Scored] = []
    best_mem = math.inf
    for s in sorted(feasible, key=lambda s: (s.step_time, s.peak_memory)):
        if s.peak_memory < best_mem:
            front.append(s)
            best_mem = s.peak_memory
    if len(front) > limit:  # keep the ends and an even spread between
        idx = sorted({round(i * (len(front) - 1) / (limit - 1)) for i in range(limit)})
        front = [front[i] for i in idx]
    return [
        {
            "plan": s.plan.to_string(),
            "gpus": s.nodes * gpn,
            "step_time_s": s.step_time,
            "peak_memory_gib": s.peak_memory / GiB,
        }
        for s in front
    ]


def _no_fit_message(model: ModelSpec, cluster: ClusterSpec, B: int, scored: list[Scored], fix: dict[str, Any]) -> str:
    """What the smallest plan needed, the capacity, and what would make it fit."""
    smallest = min(scored, key=lambda s: s.peak_memory)
    cap = cluster.gpu.usable_memory_bytes
    need = smallest.peak_memory
    hints = []
    ratio = need / cap
    if ratio > 1:
        hints.append(f"about {math.ceil(cluster.nodes * ratio)}+ nodes (--nodes)")
    if fix.get("offload", "none") == "none" and "offload" in fix:
        hints.append("allowing offload (drop offload= from --fix)")
    elif not any(s.plan.offload != "none" for s in scored):
        hints.append("offload=cpu/nvme")
    if "ckpt" in fix and fix["ckpt"] != "full":
        hints.append("ckpt=full")
    hints.append("a smaller --global-batch or --seq-len (less activation memory)")
    return (
        f"no plan fits: the smallest needs {need / GiB:.1f} GiB per GPU ({smallest.plan.to_string()}) "
        f"but a {cluster.gpu.name} has {cap / GiB:.1f} GiB usable; try " + ", or ".join(hints)
    )
