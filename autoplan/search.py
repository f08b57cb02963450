"""The search driver behind ``autoplan plan`` (docs/design.md section 5).

1. enumerate every valid plan (``autoplan.space``) under the ``--fix`` pins;
2. estimate each with the analytic model over arrays (memory and time; ``simulator.analytic.batch``), in ``--jobs`` processes;
3. keep the feasible ones, rank them by the objective, take the top K plus everything within
   ``tolerance`` of the best;
4. give each of those its layer partition and recomputation map (``autoplan.partition``)
   and keep it when it is predicted faster than the uniform split;
5. simulate the finalists with the DES (with the analytic estimate, and a warning, when their
   DES would run past its time budget: simulator.des.budget) and return the best, the top K
   and the time-vs-memory Pareto set of all feasible plans.
With ``--objective cost`` the search also tries smaller node counts (halving), since fewer GPUs
at a longer step can cost fewer GPU-hours per million tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from autoplan import fit_hints, space, space_checks
from autoplan.finalists import prepare, refine_and_simulate_all
from autoplan.frameworks import Framework
from autoplan.frameworks import space as framework_space
from autoplan.scoring import Scored, Scores, objective_value, score_all
from autoplan.workers import SHARED, plan_job
from hwprofiles.errors import FitError, PlanError
from hwprofiles.load import with_nodes
from hwprofiles.schema import ClusterSpec
from hwprofiles.units import GiB
from simulator import Fidelity, check_fidelity
from simulator.des.budget import des_within_budget, fallback_warning
from simulator.result import SimResult
from simulator.runtime_spec import OVERLAPPED, Runtime
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
    fidelity: Fidelity = "des"  # how the finalists are simulated
    progress: bool = False
    tolerance: float = 0.02  # finalists: top K plus plans within this fraction of the best
    max_finalists: int = 16
    partition: bool = True
    # CP-SAT's wall-clock cap per finalist: its work limit (partition.WORK_LIMIT) comes first
    partition_time_s: float = 2.0
    # how the program runs the plan (simulator.runtime_spec.Runtime): None is the framework's own (base_runtime)
    runtime: Runtime | None = None
    framework: Framework | None = None  # the stack that runs it: only its plans, each priced with its runtime
    keep_timeline: bool = False  # keep each finalist's DES record (for plots and traces; megabytes each)
    # the time-vs-memory front of all the plans, which needs every fitting plan's step time; off,
    # only the plans that could lead are priced (autoplan.scoring.score_run): a sweep's sizes
    pareto: bool = True

    @property
    def base_runtime(self) -> Runtime:
        """The runtime the plans are priced from, before each plan's own rules
        (autoplan.frameworks.pricing.plan_runtime): ``runtime`` where given (the command line gives
        its framework's with its overrides: --no-dp-overlap, --zero3-runtime, --reduce-dtype),
        else the framework's (Framework.base_runtime), else the overlapped default
        (simulator.runtime_spec.OVERLAPPED). A framework named without a runtime is never priced
        with another stack's."""
        if self.runtime is not None:
            return self.runtime
        return self.framework.base_runtime() if self.framework else OVERLAPPED


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
    nodes_given: int = 1  # --nodes (the cost objective also tries fewer: each entry's "nodes")

    def entry(self, r: SimResult) -> dict[str, Any]:
        d = r.to_dict()
        d["cost_gpu_hours_per_mtok"] = cost_per_mtok(r)
        d["plan_string"] = r.job.plan.to_string()
        d["nodes"] = r.job.cluster.nodes
        return d

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.entry(self.best_result),
            "top": [self.entry(r) for r in self.top],
            "pareto": self.pareto,
            "partition": self.partition_gains,
            "objective": self.objective,
            "nodes_given": self.nodes_given,
            "candidates_total": self.candidates_total,
            "candidates_feasible": self.candidates_feasible,
            "candidates_simulated": self.candidates_simulated,
            "search_time_s": self.search_time_s,
        }


def cost_per_mtok(r: SimResult) -> float:
    """GPU-hours per million tokens: GPUs * step / 3600 / (tokens per step / 1e6)."""
    tokens = r.job.global_batch * r.job.seq
    return r.job.cluster.num_gpus * r.step_time / 3600.0 / (tokens / 1e6)


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
    return objective_value(s.step_time, s.nodes, gpus_per_node, objective)


def search(model: ModelSpec, cluster: ClusterSpec, global_batch: int, opts: SearchOptions) -> SearchResult:
    t0 = time.perf_counter()
    gpn = cluster.gpus_per_node
    clusters = {
        n: (cluster if n == cluster.nodes else with_nodes(cluster, n)) for n in _node_counts(cluster, opts.objective)
    }
    layouts = _share_inputs(model, clusters, global_batch, opts)
    keep = max(opts.top, opts.max_finalists)
    scores = score_all(layouts, keep, opts.objective, opts.jobs, opts.progress, prepare)
    log.debug(
        "search: %d candidate plans on %s nodes, %d fit in memory",
        scores.total,
        "/".join(map(str, clusters)),
        scores.feasible,
    )
    _check_scores(model, cluster, global_batch, scores, opts)
    leaders = scores.leaders  # the feasible plans the framework runs, first by the objective
    best_val = _objective(leaders[0], opts.objective, gpn)
    finalists = [
        s
        for i, s in enumerate(leaders)
        if i < opts.top or _objective(s, opts.objective, gpn) <= best_val * (1 + opts.tolerance)
    ]

    fallback = _des_over_budget(finalists, opts)
    if fallback:
        opts = replace(opts, fidelity="analytic")
        SHARED["opts"] = opts  # before the finalists' workers fork
    log.debug("search: refining and simulating %d finalists (fidelity %s)", len(finalists), opts.fidelity)
    gains, simulated = refine_and_simulate_all(finalists, opts.jobs, opts.progress)
    if fallback:
        for r in simulated:
            r.extra["fidelity_reason"] = fallback
    fitting = [r for r in simulated if r.fits] or simulated
    fitting.sort(key=lambda r: _objective(r, opts.objective, gpn))
    return SearchResult(
        best_result=fitting[0],
        top=fitting[: opts.top],
        pareto=_pareto(scores.front, gpn),
        candidates_total=scores.total,
        candidates_feasible=scores.feasible,
        candidates_simulated=len(simulated),
        search_time_s=time.perf_counter() - t0,
        objective=opts.objective,
        partition_gains=gains,
        nodes_given=cluster.nodes,
    )


def _share_inputs(
    model: ModelSpec, clusters: dict[int, ClusterSpec], global_batch: int, opts: SearchOptions
) -> dict[int, list[space.Shape]]:
    """Check the search's inputs on ``clusters`` (node count -> cluster, the first the one asked
    for), put them in :data:`SHARED` for the workers (model, clusters, batch, pins, options,
    precisions, offload targets, the framework's option rule) and return the shapes of the plans
    on each node count that the framework runs (PlanError when there are none)."""
    cluster = next(iter(clusters.values()))
    fix = space.parse_fix(opts.fix)
    space_checks.check_cluster_size(model, cluster.num_gpus, global_batch)
    fw = opts.framework
    precs = space.precisions(cluster.gpu, fix)  # the hardware's rules for the pins first
    offloads = space.offloads(cluster.node, fix)
    layouts = _layouts(model, clusters, global_batch, fix, fw)
    check_fidelity(opts.fidelity, cluster.num_gpus)  # before the estimates: they take a while at this size
    rule = framework_space.option_rule(fw, model) if fw else None
    SHARED.update(
        model=model, clusters=clusters, B=global_batch, fix=fix, opts=opts, precs=precs, offloads=offloads, keep=rule
    )
    return layouts


def _layouts(
    model: ModelSpec, clusters: dict[int, ClusterSpec], global_batch: int, fix: dict[str, Any], fw: Framework | None
) -> dict[int, list[space.Shape]]:
    """The shapes of the plans on each node count that the framework runs; PlanError when a pin
    is one it does not run, or when the pins leave no shape (saying which rule they break)."""
    if fw and (why := framework_space.fix_refusal(fw, model, fix)):
        raise PlanError(f"--fix: {why}")
    runs = framework_space.shape_rule(fw, model) if fw else None
    layouts = {
        n: [s for s in space.shapes(model, c.num_gpus, global_batch, fix) if runs is None or runs(s)]
        for n, c in clusters.items()
    }
    if not any(layouts.values()):
        gpus = next(iter(clusters.values())).num_gpus
        raise PlanError(space_checks.explain_empty(model, gpus, global_batch, fix) + _framework_note(fw))
    return layouts


def _check_scores(
    model: ModelSpec, cluster: ClusterSpec, global_batch: int, scores: Scores, opts: SearchOptions
) -> None:
    """That the scored plans (:data:`SHARED`'s pins) leave a plan to run: PlanError when there
    were none, NoPlanFits when none fits or when none of the fastest that fit runs unchanged in
    the framework's files."""
    fix, fw = SHARED["fix"], opts.framework
    if not scores.total:
        raise PlanError(space_checks.explain_empty(model, cluster.num_gpus, global_batch, fix) + _framework_note(fw))
    if not scores.feasible:
        raise NoPlanFits(fit_hints.search_no_fit(model, cluster, fix, scores, fw))
    if not scores.leaders:  # plans fit, but none of the fastest runs unchanged in the framework's files
        assert fw is not None and scores.refused is not None
        raise NoPlanFits(_unrunnable_message(fw, scores))


def _unrunnable_message(fw: Framework, scores: Scores) -> str:
    """Plans fit, but none of the fastest of them (autoplan.scoring.FILES_SCAN of each worker's
    run) runs unchanged in the framework's files (autoplan.frameworks.exports): one reason."""
    return (
        f"none of the fastest of the {scores.feasible:,} plans that fit runs unchanged in {fw.name}'s files: "
        f"{scores.refused}"
    )


def _framework_note(fw: Framework | None) -> str:
    """What the framework adds to an empty space's explanation: its plan keys limit it."""
    if fw is None:
        return ""
    only = "" if fw.runs.tensor or fw.runs.pipeline else ": data parallelism only, t = p = 1, d = the GPUs"
    return f" (with --framework {fw.name}: only the plans it runs{only}; autoplan/frameworks/profiles/{fw.name}.yaml)"


def _des_over_budget(finalists: list[Scored], opts: SearchOptions) -> str | None:
    """Why the finalists' DES, shared by the workers, would run past the time budget
    (simulator.des.budget), warned about: the search then simulates them with the analytic
    estimate; None when it keeps to it or the search is analytic anyway. Plots and traces need
    the DES: an InputError then."""
    if opts.fidelity != "des":
        return None
    jobs = [plan_job(f.nodes, f.plan) for f in finalists]
    des_only = ("--plot", "--trace") if opts.keep_timeline else ()
    reason = des_within_budget(jobs, min(opts.jobs, len(jobs)), False, des_only)
    if reason:
        log.warning("%s", fallback_warning(reason))
    return reason


def _pareto(front: list[Scored], gpn: int, limit: int = 12) -> list[dict[str, Any]]:
    """The plans no other plan beats in both step time and peak memory (``front``: scoring.pareto_front,
    fastest first), at most ``limit`` of them."""
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
