"""The best plan for each cluster size, what training on it takes once interruptions are priced
in, and the size to choose (``autoplan plan --nodes A:B``).

For each node count the search runs as ``autoplan plan`` does (autoplan.search); its best plan
gives the step time, tokens/s and MFU. With T tokens to train, a size of G GPUs trains for
T / (tokens/s) seconds of work; interruptions (autoplan.sizing.failures, the cluster's
``reliability``) stretch that by the expected wall factor F at Daly's checkpoint interval, with
checkpoints of the plan's weights and optimizer state written and read at the storage's
bandwidth. GPU-hours = G * wall hours; cost = GPU-hours * the price of a GPU-hour.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from autoplan.search import SearchOptions, search
from autoplan.sizing import failures
from autoplan.workers import Pool, progress
from hwprofiles.errors import AutoplanError, InputError
from hwprofiles.load import with_nodes
from hwprofiles.schema import ClusterSpec
from simulator.cost.ops import dtype_bytes
from simulator.cost.params import total_params
from simulator.cost.state_bytes import program_state_bytes
from simulator.result import SimResult
from simulator.specs import ModelSpec

SECONDS_PER_DAY = 86400.0


#: the most tokens a sweep prices: about 70 times Llama 3's 15 trillion (Dubey et al. 2024, section 3.1)
MAX_TOKENS = 1e15


@dataclass(frozen=True)
class Goal:
    """What the sweep is for: ``tokens`` to train (None: only per-step figures), the price of a
    GPU-hour (None: GPU-hours only), a deadline in days, and what picks among the sizes."""

    tokens: float | None = None
    price: float | None = None
    deadline_days: float | None = None
    objective: Literal["time", "cost"] = "time"

    def __post_init__(self) -> None:
        """InputError for a goal the sweep cannot price: a deadline without tokens, or more tokens
        than :data:`MAX_TOKENS` (days and costs then print as hundreds of digits)."""
        if self.deadline_days is not None and self.tokens is None:
            raise InputError("--deadline needs --tokens (the days to train depend on the tokens)")
        if self.tokens is not None and self.tokens > MAX_TOKENS:
            raise InputError(f"--tokens {self.tokens:g}: at most {MAX_TOKENS:g} (Llama 3 trained on 15e12)")


@dataclass(frozen=True)
class SizeRow:
    """One cluster size: its best plan and, with tokens, what training on it takes."""

    nodes: int
    gpus: int
    plan: str
    step_time_s: float
    tokens_per_s: float
    mfu: float
    checkpoint_s: float  # one checkpoint's write (and read) time
    checkpoint_interval_s: float  # work seconds between checkpoints (Daly)
    mtbf_h: float  # the job's mean time between interruptions
    goodput: float  # work seconds per wall second with interruptions
    days: float | None = None  # work days, no interruptions
    days_with_failures: float | None = None
    gpu_hours: float | None = None  # with interruptions
    cost: float | None = None
    meets_deadline: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def checkpoint_bytes(model: ModelSpec, result: SimResult) -> float:
    """Bytes of one checkpoint: every parameter's weight and its optimizer state, as the plan's
    runtime keeps them (simulator.cost.state_bytes.program_state_bytes without ZeRO-1's working
    buffers: fp32 weights and Adam's two moments in autoplan's program, 12 bytes; e-byte weights,
    fp32 master weights and moments in mixed precision, e + 12)."""
    job = result.job
    weight, _, optimizer = program_state_bytes(job.runtime.states, dtype_bytes(job.cluster.gpu), 0)
    return float(total_params(model)) * (weight + optimizer)


def size_row(model: ModelSpec, cluster: ClusterSpec, result: SimResult, goal: Goal) -> SizeRow:
    """The row of one size from its best plan (module docstring)."""
    gpus, rel = cluster.num_gpus, cluster.reliability
    dump = failures.checkpoint_seconds(checkpoint_bytes(model, result), gpus, rel.checkpoint_GBps_per_gpu)
    mtbf = failures.job_mtbf_s(rel.failures_per_gpu_hour, gpus)
    interval = failures.daly_interval_s(dump, mtbf)
    factor = failures.expected_wall_factor(interval, dump, rel.detect_s + rel.relaunch_s + dump, mtbf)
    row = SizeRow(
        nodes=cluster.nodes,
        gpus=gpus,
        plan=result.job.plan.to_string(),
        step_time_s=result.step_time,
        tokens_per_s=result.tokens_per_s,
        mfu=result.mfu,
        checkpoint_s=dump,
        checkpoint_interval_s=interval,
        mtbf_h=mtbf / 3600.0,
        goodput=1.0 / factor,
    )
    if goal.tokens is None:
        return row
    work_s = goal.tokens / row.tokens_per_s
    wall_days = work_s * factor / SECONDS_PER_DAY
    gpu_hours = gpus * wall_days * 24.0
    return replace(
        row,
        days=work_s / SECONDS_PER_DAY,
        days_with_failures=wall_days,
        gpu_hours=gpu_hours,
        cost=gpu_hours * goal.price if goal.price is not None else None,
        meets_deadline=wall_days <= goal.deadline_days if goal.deadline_days is not None else None,
    )


def choose(rows: list[SizeRow], goal: Goal) -> SizeRow | None:
    """The size the goal picks: among those that meet the deadline (all without one), the
    shortest time to train with interruptions (objective time) or the fewest GPU-hours of it
    (objective cost: the same order as the cost at one price); per token when no tokens are given.
    None when no size meets the deadline."""
    fit = [r for r in rows if r.meets_deadline is not False]
    if not fit:
        return None
    if goal.objective == "time":
        return min(fit, key=lambda r: 1.0 / (r.tokens_per_s * r.goodput))
    return min(fit, key=lambda r: r.gpus / (r.tokens_per_s * r.goodput))


@dataclass
class Sweep:
    rows: list[SizeRow]
    skipped: list[dict[str, Any]]  # {"nodes": n, "reason": one line}
    choice: SizeRow | None
    goal: Goal
    search_time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "sizes": [r.to_dict() for r in self.rows],
            "choice": self.choice.to_dict() if self.choice else None,
            "skipped": self.skipped,
            "goal": asdict(self.goal),
            "search_time_s": self.search_time_s,
        }


#: the sweep's inputs, set before its workers fork (each worker plans whole sizes, one at a time)
_SWEEP: dict[str, Any] = {}


def sweep(
    model: ModelSpec, cluster: ClusterSpec, global_batch: int, counts: list[int], opts: SearchOptions, goal: Goal
) -> Sweep:
    """Plan every size of ``counts`` (module docstring). A size no plan can use is skipped with
    its reason; when none can be planned, the first size's error is raised.

    The sizes are shared among ``opts.jobs`` worker processes, each searching a whole size in
    its own process (``jobs`` = 1 inside): a size's search is too short (about a second) for
    its own pool to pay, which forks twice per size, and the sizes are independent."""
    t0 = time.perf_counter()
    _SWEEP.update(
        model=model,
        cluster=cluster,
        B=global_batch,
        opts=replace(opts, jobs=1, progress=False, pareto=False),
        goal=goal,
    )
    rows: list[SizeRow] = []
    skipped: list[dict[str, Any]] = []
    first_error: AutoplanError | None = None
    bar = progress(len(counts), opts.progress, "planning sizes", "size", least=2)
    with Pool(min(opts.jobs, len(counts))) as pool:
        for n, (row, error) in zip(counts, pool.imap(_plan_size, counts)):
            bar.update(1)
            if row is not None:
                rows.append(row)
                continue
            assert error is not None
            first_error = first_error or error
            skipped.append({"nodes": n, "reason": str(error).splitlines()[0]})
    bar.close()
    if not rows:
        assert first_error is not None
        raise first_error
    return Sweep(rows, skipped, choose(rows, goal), goal, time.perf_counter() - t0)


def _plan_size(n: int) -> tuple[SizeRow | None, AutoplanError | None]:
    """The row of the size of ``n`` nodes (the sweep's inputs: :data:`_SWEEP`), or why no plan
    can use it."""
    cluster = _SWEEP["cluster"]
    try:
        size = cluster if n == cluster.nodes else with_nodes(cluster, n)
        found = search(_SWEEP["model"], size, _SWEEP["B"], _SWEEP["opts"])
    except AutoplanError as e:
        return None, e
    return size_row(_SWEEP["model"], size, found.best_result, _SWEEP["goal"]), None
