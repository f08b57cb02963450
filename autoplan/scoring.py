"""Step 2 of the search: the analytic estimate of every candidate plan, in the worker pool.

The parent lists the plans' shapes (their parallel layouts: :func:`autoplan.space.shapes`);
each worker expands a contiguous run of them into plans (:func:`autoplan.space.plan_table`:
columns, no Plan object per plan), scores them with
:func:`simulator.analytic.batch.staged_groups` (the analytic model over arrays;
:func:`simulator.analytic.estimate` is its scalar reference) and sends back only what
the search keeps of them (:class:`Scores`): the counts, the first plans by the objective, the
time-vs-memory Pareto front (unless the search asks for none: a sweep's sizes, whose runs then
price only the plans that could lead, :func:`_leading`) and the plan needing least memory. Merged
in the enumeration's order, these are exactly what ranking every plan at once gives (stable
sorts: a plan among the first k of all is among the first k of its run; one on the front of all
is on the front of its run), without building, sending or sorting a record per plan.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.frameworks.exports import files_differ
from autoplan.frameworks.pricing import runtime_groups
from autoplan.space import Shape, plan_table
from autoplan.workers import SHARED, Pool, plan_job, progress
from hwprofiles.schema import ClusterSpec
from simulator.analytic.batch import GroupedEstimate, staged_groups
from simulator.gc_pause import paused_gc
from simulator.plan import Plan
from simulator.plan.table import PlanTable

#: runs of shapes per worker process: enough to balance the workers, few enough that each run's
#: plans share their per-layout work
RUNS_PER_JOB = 4

#: the fitting plans of a run, fastest first, whose framework's files a worker checks before it
#: stops looking for leaders those files run: a file rule can refuse a whole family of plans (torch's
#: zero-bubble schedule needs m to be a multiple of m // p), and the fastest plans of a size can
#: all be of that family
FILES_SCAN = 1024


@dataclass
class Scored:
    """A plan's analytic score: step time (inf when it does not fit in GPU memory, or was not priced:
    a run without its front, :func:`_leading`), peak memory, fits."""

    plan: Plan
    nodes: int
    step_time: float
    peak_memory: float
    fits: bool


def objective_value(step_time: Any, nodes: int, gpus_per_node: int, objective: str) -> Any:
    """What the search minimizes: the step time, or with ``objective`` "cost" the GPU-seconds per
    step (step time x GPUs). Numbers or arrays alike."""
    return step_time * nodes * gpus_per_node if objective == "cost" else step_time


@dataclass
class Scores:
    """What the search keeps of the scores of a run of plans (module docstring).

    ``leaders``: the fitting plans whose framework's files run them as planned
    (autoplan.frameworks.exports.files_differ) first by the objective, in enumeration order among
    equals, at most ``keep``; ``refused``: why a fitting plan those files do not run as planned
    was passed over, if one was; ``front``: the fitting plans no other beats in both step time
    and peak memory (:func:`pareto_front`; empty when the search asks for none); ``smallest``: the plan with the least peak memory
    (what the no-fit message quotes); ``offload``: whether any plan offloads."""

    total: int
    feasible: int
    leaders: list[Scored]
    front: list[Scored]
    smallest: Scored | None
    offload: bool
    refused: str | None = None

    @staticmethod
    def merge(parts: Sequence[Scores], keep: int, objective: str, gpus_per_node: int) -> Scores:
        """The scores of the runs together, ``parts`` in enumeration order."""
        leaders = [s for part in parts for s in part.leaders]
        leaders.sort(key=lambda s: objective_value(s.step_time, s.nodes, gpus_per_node, objective))
        smallest = [part.smallest for part in parts if part.smallest is not None]
        return Scores(
            total=sum(part.total for part in parts),
            feasible=sum(part.feasible for part in parts),
            leaders=leaders[:keep],
            front=pareto_front([s for part in parts for s in part.front]),
            smallest=min(smallest, key=lambda s: s.peak_memory) if smallest else None,
            offload=any(part.offload for part in parts),
            refused=next((part.refused for part in parts if part.refused), None),
        )


def pareto_front(scored: list[Scored]) -> list[Scored]:
    """The plans no other plan beats in both step time and peak memory, fastest first (sorted by
    (step time, peak memory), a plan kept when it needs less memory than every one before it)."""
    front: list[Scored] = []
    least = float("inf")
    for s in sorted(scored, key=lambda s: (s.step_time, s.peak_memory)):
        if s.peak_memory < least:
            front.append(s)
            least = s.peak_memory
    return front


def score_run(plans: PlanTable, nodes: int, keep: int, objective: str) -> Scores:
    """:class:`Scores` of ``plans`` on ``nodes`` nodes (the model, clusters, batch and options
    from :data:`SHARED`). Without the time-vs-memory front (SearchOptions.pareto off: a sweep's
    sizes) only the fitting plans whose step-time floor could put them among the leaders are
    priced (:func:`_leading`), and the front is empty."""
    cluster = SHARED["clusters"][nodes]
    est = _estimates(plans, cluster)
    gpn = cluster.gpus_per_node
    value = lambda x: objective_value(x, nodes, gpn, objective)
    if SHARED["opts"].pareto:
        r = est.priced()
        step, peak, fits = r.step_time, r.peak_memory, r.fits
        ok = np.flatnonzero(fits)
        leaders, refused, _ = _runnable(ok[np.argsort(value(step[ok]), kind="stable")], plans, nodes, keep, {})
        by_time = ok[np.lexsort((peak[ok], step[ok]))]  # pareto_front's order; lexsort is stable
        least = np.minimum.accumulate(peak[by_time])
        on_front = by_time[np.concatenate(([True], least[1:] < least[:-1]))] if len(by_time) else by_time
    else:
        step, peak, fits, leaders, refused = _leading(est, plans, nodes, keep, value)
        on_front = np.zeros(0, dtype=np.int64)

    def scored(i: int) -> Scored:
        return Scored(plans[i], nodes, float(step[i]), float(peak[i]), bool(fits[i]))

    return Scores(
        total=len(plans),
        feasible=int(fits.sum()),
        leaders=[scored(i) for i in leaders],
        front=[scored(i) for i in on_front.tolist()],
        smallest=scored(int(np.argmin(peak))) if len(plans) else None,
        offload=any(o != "none" for o in plans.values("offload")),
        refused=refused,
    )


#: the fitting plans a run without its front prices first, lowest step-time floor first
#: (:func:`_leading`); each further round prices twice as many
FIRST_PRICED = 256

#: how far a floor must clear the last leader's objective value to leave its plan unpriced: a
#: floor equal to the step time (a plan priced whole: simulator.analytic.batch.staged.PricedEstimate)
#: may differ from it by rounding
FLOOR_MARGIN = 1e-9


def _leading(
    est: GroupedEstimate, plans: PlanTable, nodes: int, keep: int, value: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], str | None]:
    """(step times: of the plans priced, inf for the rest; peak memory and fit of every plan; the
    leaders; why a plan was passed over), the leaders exactly those of pricing every plan that
    fits. The fitting plans are priced in rounds, lowest floor first (simulator.analytic.batch.
    terms.step_floor: at most the step time), until the next floor exceeds the objective value of
    the last plan the leaders' scan (:func:`_runnable`) read: every plan left ranks after it.
    ``value``: the objective's value of step times (objective_value)."""
    mem = est.memory()
    ok = np.flatnonzero(mem.fits)
    step = np.full(len(plans), np.inf)
    floor = np.full(len(plans), np.inf)
    floor[ok] = est.floor(ok)
    order = ok[np.argsort(value(floor[ok]), kind="stable")]
    done, size = 0, FIRST_PRICED
    verdicts: dict[int, str | None] = {}
    while True:
        new = order[done : done + size]
        step[new] = est.step_times(new)
        done, size = done + len(new), 2 * size
        priced = np.sort(order[:done])  # in the plans' order: equal values rank by position
        ranked = priced[np.argsort(value(step[priced]), kind="stable")]
        leaders, refused, last = _runnable(ranked, plans, nodes, keep, verdicts)
        if done == len(order) or (
            last is not None and value(floor[order[done]]) * (1 - FLOOR_MARGIN) > value(step[ranked[last]])
        ):
            return step, mem.peak, mem.fits, leaders, refused


def _runnable(
    ranked: np.ndarray, plans: PlanTable, nodes: int, keep: int, verdicts: dict[int, str | None]
) -> tuple[list[int], str | None, int | None]:
    """The first ``keep`` rows of ``ranked`` (plan rows, fastest first) whose framework's files
    run them as planned, among the first :data:`FILES_SCAN`; why the first row passed over was
    (None: none was); and the position in ``ranked`` of the last row read (None: ``ranked`` ran
    out first, so more rows could change the answer). Without a framework, or one whose files
    autoplan does not write, the first ``keep``. ``verdicts``: each row's answer found before (a
    run priced in rounds reads its first rows again), read first and filled with what is new."""
    fw = SHARED["opts"].framework
    if fw is None or fw.export is None:
        return ranked[:keep].tolist(), None, keep - 1 if 0 < keep <= len(ranked) else None
    kept: list[int] = []
    refused = None
    for k, i in enumerate(ranked[:FILES_SCAN].tolist()):
        if i not in verdicts:
            verdicts[i] = files_differ(fw, plan_job(nodes, plans[i]))
        why = verdicts[i]
        if why is None:
            kept.append(i)
            if len(kept) == keep:
                return kept, refused, k
        elif refused is None:
            refused = why
    return kept, refused, FILES_SCAN - 1 if len(ranked) >= FILES_SCAN else None


def _estimates(plans: PlanTable, cluster: ClusterSpec) -> GroupedEstimate:
    """Every plan's peak memory, fit and step-time floor, and its step time on demand, each priced
    with the runtime its framework runs it with (autoplan.frameworks.pricing.runtime_groups: one
    batch per runtime)."""
    opts = SHARED["opts"]
    groups = runtime_groups(opts.framework, opts.base_runtime, plans, cluster.node.backend)
    return staged_groups(SHARED["model"], cluster, plans, SHARED["B"], groups)


def _score_shapes(args: tuple[int, int, int, int, str]) -> Scores:
    """Scores of the plans of shapes ``start:stop`` of those on ``nodes`` nodes
    (:data:`SHARED` ``["shapes"][nodes]``, inherited by the forked workers)."""
    nodes, start, stop, keep, objective = args
    cluster = SHARED["clusters"][nodes]
    layouts = SHARED["shapes"][nodes][start:stop]
    with paused_gc():  # arrays of plans by the ten thousand, no cycles among them
        plans = plan_table(
            SHARED["model"],
            layouts,
            SHARED["fix"],
            cluster.gpus_per_node,
            SHARED["precs"],
            SHARED["offloads"],
            SHARED.get("keep"),
        )
        return score_run(plans, nodes, keep, objective)


def score_all(
    shapes_by_nodes: dict[int, list[Shape]],
    keep: int,
    objective: str,
    jobs: int,
    show_progress: bool,
    meanwhile: Callable[[], None] | None = None,
) -> Scores:
    """The :class:`Scores` of every plan of the shapes on each node count (in the dictionary's
    order); :data:`SHARED` holds the model, clusters, batch, pins, precisions, offload targets and
    options.
    ``meanwhile``: work for the otherwise idle parent process while the workers score (run in a
    thread started after the workers are forked and joined before returning, so no later fork
    copies it half done)."""
    SHARED["shapes"] = shapes_by_nodes
    tasks = []
    for n, layouts in shapes_by_nodes.items():
        size = max(1, -(-len(layouts) // (RUNS_PER_JOB * jobs))) if jobs > 1 else max(1, len(layouts))
        tasks += [(n, i, min(i + size, len(layouts)), keep, objective) for i in range(0, len(layouts), size)]
    bar = progress(sum(map(len, shapes_by_nodes.values())), show_progress, "estimating plans", "layout", least=1000)
    parts: list[Scores] = []
    with Pool(jobs if len(tasks) > 1 else 1) as pool:
        side = threading.Thread(target=meanwhile, daemon=True) if meanwhile and pool.forked else None
        if side:
            side.start()
        for task, part in zip(tasks, pool.imap(_score_shapes, tasks, blocks=True)):
            parts.append(part)
            bar.update(task[2] - task[1])
        if side:
            side.join()
    bar.close()
    gpn = next(iter(SHARED["clusters"].values())).gpus_per_node
    return Scores.merge(parts, keep, objective, gpn)
