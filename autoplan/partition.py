"""CP-SAT: layer partition over pipeline chunks and per-chunk recomputation.

Variables per chunk c (p*v chunks, chunk c on device c % p): n_c layers (>= 1, sum = L),
f_c layers fully recomputed, s_c selectively recomputed (f_c + s_c <= n_c).
Per device i, per microbatch (microseconds, integers):
    time_i = sum_{c on i} [ n_c * (F + B + 4*T + Rf + Rb + 4*X) + f_c * (F + 2*T + Rf + 2*X) + s_c * (A + Rf) ]
             + E[i=0] + H[i=p-1]
with F, B the layer's forward/backward compute as the job's runtime runs it (its layer kernels,
attention kernel and loss: simulator.cost.block_times.job_block_times), T one TP all-reduce, A the attention core
(selective recompute), Rf/Rb what the context-parallel ring adds to an attention's forward and
backward (0 at cp = 1), X one token all-to-all of expert parallelism (0 at ep = 1; two per
pass), E/H the embedding and head passes; T's counts are 2 per pass, 1 + k with a mixture of
experts.
with T's counts from simulator.cost.stage (tp_per_layer, tp_per_full_recompute, TP_EMBEDDING, TP_HEAD).
Memory of device i (bytes, scaled to MiB): the linear form of the one stage-memory model as the
job's runtime holds it, simulator.cost.stage_memory_linear.DeviceMemoryModel, one constraint per
reachable occupancy vector k of the schedule (simulator.cost.memory.chunk_occupancy) and per phase
ph whose transient can be the largest (the recompute's: a_none * [f on i > 0]):
    mem_i = fixed_i + sum_{c on i} [ cn_c(k) n_c + cf_c(k) f_c + cs_c(k) s_c ] + phase_ph(n, f)  <=  capacity
so stage 0 of 1F1B, which holds p microbatches, gets fewer layers or more recomputation.
Objective: the pipeline time (m - 1) * max_i time_i + sum_i time_i (interleaved:
m * max + (sum - max)/v), i.e. the slowest stage dominates and the rest break ties.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from operator import mul
from typing import TYPE_CHECKING, Literal, NamedTuple

from autoplan.cpsat import load_cp_model
from autoplan.pipeline_balance import balanced_layers, device_extras, pipeline_objective
from autoplan.pipeline_memory import Row, memory_balanced
from simulator.cost.block_times import TP_EMBEDDING, TP_HEAD, job_block_times, tp_per_full_recompute, tp_per_layer
from simulator.cost.experts import ALL_TO_ALLS_PER_PASS
from simulator.cost.rank_view import rank_job, user_plan
from simulator.cost.schedules import rank_chunks
from simulator.cost.stage_memory_linear import DeviceMemoryModel
from simulator.job import Job
from simulator.plan import Plan, RecomputeName

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

US = 1e6  # seconds -> integer microseconds
MIB = float(2**20)


@dataclass(frozen=True)
class PartitionResult:
    plan: Plan  # with layers= and recompute= filled in
    objective_s: float  # pipeline time the model minimized (seconds)
    status: str  # OPTIMAL or FEASIBLE


@dataclass(frozen=True)
class LayerTimes:
    """Integer microseconds per microbatch of the partition's time terms (module docstring)."""

    per_layer: int  # F + B + tp_per_layer * T
    full_extra: int  # F + tp_per_full_recompute * T
    sel_extra: int  # A
    emb: int  # E
    head: int  # H

    @staticmethod
    def of(job: Job) -> LayerTimes:
        """The terms of ``job``'s plan as its runtime runs it (simulator.cost.block_times.job_block_times)."""
        model = job.model
        bt = job_block_times(job)
        tp, cp_f, a2a = bt.tp_all_reduce, bt.cp_forward, ALL_TO_ALLS_PER_PASS * bt.ep_all_to_all
        return LayerTimes(
            per_layer=round(
                (bt.layer.forward + bt.layer.backward + tp_per_layer(model) * tp + cp_f + bt.cp_backward + 2 * a2a) * US
            ),
            full_extra=round((bt.layer.forward + tp_per_full_recompute(model) * tp + cp_f + a2a) * US),
            sel_extra=round((bt.layer.attention_core + cp_f) * US),
            emb=round((bt.embedding.forward + bt.embedding.backward + TP_EMBEDDING * tp) * US),
            head=round((bt.head.forward + bt.head.backward + TP_HEAD * tp) * US),
        )


#: CP-SAT's work per partition, in its deterministic time units (``max_deterministic_time``: a
#: count of the solver's work, the same on any machine and load with one worker, so the same
#: model stops at the same solution everywhere). A wall-clock limit did not: on 2026-11-28 the
#: gpt-1t sweep's 155-node plan (t=5,p=31,d=8,mb=3,zero=3) was proved optimal in 0.49 s once
#: (353.2 s steps) and stopped at the 0.5 s limit on a busier moment (389.8 s). Over the 86
#: partitions of gpt-1t on 140..170 nodes, run to the end on this project's 2-core VM: median
#: 0.022 units, 90th percentile 0.084, the largest 0.30 (1.0 s); a unit took 3-7 s there.
WORK_LIMIT = 0.1


def optimize_partition(job: Job, choose_recompute: bool = True, time_limit_s: float = 2.0) -> PartitionResult | None:
    """Best layer split (and recompute map) for ``job``'s plan shape, its times and memory as the
    job's runtime runs it; None when nothing fits. The solver stops at :data:`WORK_LIMIT` of its
    deterministic work (the same answer on any machine), or after ``time_limit_s`` seconds on a
    machine so slow that this comes first.

    The model without its memory constraints is solved first, in closed form
    (:func:`_time_optimum`, autoplan.pipeline_balance): a split optimal without them that meets
    them (:func:`_fits`) is optimal with them, since the constraints only remove splits. The full
    model goes to CP-SAT only when it does not.

    With ``choose_recompute`` False the recomputation follows ``plan.ckpt`` for every layer
    and only the split is optimized. A context- or expert-parallel plan is partitioned on one rank's view
    (simulator.cost.rank_view.rank_job; its microbatch count m is the same)."""
    plan = job.plan
    if plan.cp > 1 or plan.ep > 1:
        found = optimize_partition(rank_job(job), choose_recompute, time_limit_s)
        return None if found is None else dataclasses.replace(found, plan=user_plan(found.plan, plan))
    if plan.p * plan.v > job.model.num_layers:
        return None
    times = LayerTimes.of(job)
    memory = _device_memory(job)
    relaxed = _time_optimum(job, times, choose_recompute)
    solved = (
        relaxed
        if _fits(memory, *relaxed[:3])
        else _memory_optimum(job, times, memory, choose_recompute)
        or _solve(job, times, memory, choose_recompute, time_limit_s)
    )
    if solved is None:
        return None
    layers, full, sel, objective, status = solved
    rec = tuple(zip(full, sel)) if choose_recompute else None
    div = plan.v if plan.schedule == "interleaved" and plan.v > 1 else 1
    return PartitionResult(_solved_plan(plan, job.model.num_layers, layers, rec), objective / US / div, status)


#: a solved split: per chunk its layers, fully and selectively recomputed layers; the objective
#: (integer microseconds); "OPTIMAL" (within the solver's relative gap) or "FEASIBLE"
Solved = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], float, str]


def _time_optimum(job: Job, times: LayerTimes, choose_recompute: bool) -> Solved:
    """The split that minimizes the pipeline time with no memory limit (autoplan.pipeline_balance:
    no recomputation, or the plan's pinned one at its cost per layer), the plan's own split where
    it is as good (the finalist the analytic model ranked, as CP-SAT's search started from it)."""
    plan, L, m = job.plan, job.model.num_layers, job.m
    pinned = {"full": times.full_extra, "selective": times.sel_extra}.get(plan.ckpt, 0) if not choose_recompute else 0
    per = times.per_layer + pinned
    extras = device_extras(plan.schedule, plan.p, plan.v, times.emb, times.head)
    interleaved = plan.schedule == "interleaved"

    def objective(split: tuple[int, ...]) -> int:
        dev = [
            sum(split[c] for c in ids) * per + x for ids, x in zip(rank_chunks(plan.schedule, plan.p, plan.v), extras)
        ]
        return pipeline_objective(max(dev), sum(dev), m, plan.v, interleaved)

    best = balanced_layers(plan.schedule, plan.p, plan.v, L, per, extras)
    own = plan.chunk_layers(L)
    layers = own if objective(own) <= objective(best) else best
    none = (0,) * len(layers)
    full = layers if not choose_recompute and plan.ckpt == "full" else none
    sel = layers if not choose_recompute and plan.ckpt == "selective" else none
    return layers, full, sel, float(objective(layers)), "OPTIMAL"


def _memory_optimum(job: Job, times: LayerTimes, memory: list[DeviceMemory], choose_recompute: bool) -> Solved | None:
    """The optimum under the devices' ``memory`` in closed form where the pipeline holds one chunk
    per device (autoplan.pipeline_memory); None where that form does not apply (CP-SAT decides)."""
    plan = job.plan
    if plan.v != 1:
        return None
    rows = [[Row(r.coefs[0], r.coefs[1], r.coefs[2], r.any_full, r.limit) for r in device.rows] for device in memory]
    extras = device_extras(plan.schedule, plan.p, 1, times.emb, times.head)
    recompute = "choose" if choose_recompute else plan.ckpt
    costs = (times.full_extra, times.sel_extra)
    found = memory_balanced(rows, extras, times.per_layer, costs, job.model.num_layers, job.m, recompute)
    if found is None:
        return None
    # one chunk per device: device i holds chunk i (simulator.cost.schedules.rank_chunks with v = 1)
    return found.layers, found.full, found.sel, float(found.objective), "OPTIMAL"


def _solve(
    job: Job, times: LayerTimes, memory: list[DeviceMemory] | None, choose_recompute: bool, time_limit_s: float
) -> Solved | None:
    """CP-SAT's split of ``job``'s plan (module docstring) under each device's ``memory``
    constraints (None: no memory limit), started from the plan's own; None when nothing fits."""
    sat = load_cp_model()
    plan, L = job.plan, job.model.num_layers
    chunks = plan.p * plan.v
    mdl = sat.CpModel()
    n = [mdl.new_int_var(1, L, f"n{c}") for c in range(chunks)]
    mdl.add(sum(n) == L)
    f: list[cp_model.IntVar | int]
    s: list[cp_model.IntVar | int]
    if choose_recompute:
        f = [mdl.new_int_var(0, L, f"f{c}") for c in range(chunks)]
        s = [mdl.new_int_var(0, L, f"s{c}") for c in range(chunks)]
        for c in range(chunks):
            mdl.add(f[c] + s[c] <= n[c])
    else:
        f = [n[c] if plan.ckpt == "full" else 0 for c in range(chunks)]
        s = [n[c] if plan.ckpt == "selective" else 0 for c in range(chunks)]
    _add_devices(mdl, job, times, memory, n, f, s)
    _hint_plan(mdl, plan, L, n, f if choose_recompute else None, s if choose_recompute else None)
    solver = _solver(time_limit_s)
    status = solver.solve(mdl)
    if status not in (sat.OPTIMAL, sat.FEASIBLE):
        return None
    value = lambda xs: tuple(int(solver.value(x)) for x in xs)
    return value(n), value(f), value(s), solver.objective_value, "OPTIMAL" if status == sat.OPTIMAL else "FEASIBLE"


def _solver(time_limit_s: float) -> cp_model.CpSolver:
    """CP-SAT set for the partition model (optimize_partition's docstring: where it stops)."""
    solver = load_cp_model().CpSolver()
    solver.parameters.max_deterministic_time = WORK_LIMIT  # where it stops, on any machine (WORK_LIMIT)
    solver.parameters.max_time_in_seconds = time_limit_s  # a cap for a far slower machine
    solver.parameters.num_workers = 1
    solver.parameters.relative_gap_limit = 1e-3  # 0.1% of the pipeline time is noise next to the model's error
    # The model is small (3 integers per chunk) and its constraints already tight; started from the
    # finalist's own split (_hint_plan), the search without CP-SAT's presolve proved the optimum of
    # each of 10 finalists of the 175B, 1T and Llama-2-70B jobs in 0.002-0.11 s, where presolve and
    # no hint took 0.004-0.57 s and three times ran out of the time limit (the optima agree).
    solver.parameters.cp_model_presolve = False
    # CP-SAT's own Ctrl-C handler, on by default, sets SIGINT back to the default action (not the
    # one it found) when a solve ends: a search worker, which ignores SIGINT, would then die of a
    # Ctrl-C (with multiprocessing.Pool, holding a lock of its queues: the search hung as it ended
    # the pool, seen 2026-11-29); in a process that answers Ctrl-C (one job, a notebook), the next
    # Ctrl-C would end the process without a word. The solve is short (WORK_LIMIT): no handler.
    solver.parameters.catch_sigint_signal = False
    return solver


def _add_devices(
    mdl: cp_model.CpModel, job: Job, lt: LayerTimes, memory: list[DeviceMemory] | None, n: list, f: list, s: list
) -> None:
    """Per device: its time per microbatch and its ``memory`` constraints (None: no memory limit); then
    the pipeline-time objective (module docstring). The constraints go in device by device, so
    the full model is the one the solver always had: where it stops at its work limit, it stops
    at the same split."""
    sat = load_cp_model()
    plan, m = job.plan, job.m
    L = job.model.num_layers
    dev_chunks = rank_chunks(plan.schedule, plan.p, plan.v)
    extras = device_extras(plan.schedule, plan.p, plan.v, lt.emb, lt.head)
    for ids in dev_chunks:  # interleaving runs a device's chunks in turn: keep them within one layer
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                mdl.add(n[a] - n[b] <= 1)
                mdl.add(n[b] - n[a] <= 1)
    horizon = (lt.per_layer + lt.full_extra) * L + lt.emb + lt.head + 1
    times = []
    for i, (ids, extra) in enumerate(zip(dev_chunks, extras)):
        tm = mdl.new_int_var(0, horizon, f"time{i}")
        # each constraint as one weighted sum over the device's (n, f, s): the model Python's sum
        # of products builds (the same CP-SAT proto), made in C++ rather than term by term
        terms = [x for c in ids for x in (n[c], f[c], s[c])]
        per_chunk = (lt.per_layer, lt.full_extra, lt.sel_extra) * len(ids)
        mdl.add(tm == sat.LinearExpr.weighted_sum(terms, per_chunk) + extra)
        times.append(tm)
        if memory is not None:
            _add_memory(mdl, i, memory[i], terms, f)
    worst = mdl.new_int_var(0, horizon, "worst")
    mdl.add_max_equality(worst, times)
    mdl.minimize(pipeline_objective(worst, sum(times), m, plan.v, plan.schedule == "interleaved"))


class MemoryRow(NamedTuple):
    """One memory constraint of a device (module docstring), in integer thousandths of a MiB:
    ``coefs`` per (n_c, f_c, s_c) of the device's chunks in turn, plus ``any_full`` when some
    f_c > 0, at most ``limit``."""

    coefs: tuple[int, ...]
    any_full: int
    limit: int


class DeviceMemory(NamedTuple):
    """A pipeline device's chunks and its memory constraints."""

    chunks: tuple[int, ...]
    rows: tuple[MemoryRow, ...]


def _device_memory(job: Job) -> list[DeviceMemory]:
    """The memory constraints of each of ``job``'s devices, in device order: one per reachable
    occupancy vector of the schedule and per phase that can be the largest
    (simulator.cost.stage_memory_linear), each within the GPU's usable memory: a split fits where
    the estimate says it does."""
    plan = job.plan
    chunks, cap = plan.p * plan.v, job.cluster.gpu.usable_memory_bytes
    devices = []
    for i, ids in enumerate(rank_chunks(plan.schedule, plan.p, plan.v)):
        mem = DeviceMemoryModel.of(job, i, 0 in ids, chunks - 1 in ids)
        budget = _coef(cap) - _coef(mem.fixed)
        rows = []
        for vec in mem.occupancy:
            lasting = mem.coefficients(vec)
            for ph in mem.phases:
                coefs = tuple(_coef(x) for cn, cf, cs in lasting for x in (cn + ph.per_layer, cf + ph.per_full, cs))
                rows.append(MemoryRow(coefs, _coef(ph.any_full), budget - _coef(ph.constant)))
        devices.append(DeviceMemory(tuple(ids), tuple(rows)))
    return devices


def _add_memory(mdl: cp_model.CpModel, device: int, memory: DeviceMemory, terms: list, f: list) -> None:
    """Device ``device``'s memory constraints over its ``terms`` (n_c, f_c, s_c of its chunks in
    turn), with its "some layer fully recomputed" flag."""
    sat = load_cp_model()
    any_full = mdl.new_bool_var(f"anyfull{device}")
    mdl.add(sum(f[c] for c in memory.chunks) == 0).only_enforce_if(~any_full)
    for row in memory.rows:
        mdl.add(sat.LinearExpr.weighted_sum([*terms, any_full], [*row.coefs, row.any_full]) <= row.limit)


def _fits(memory: list[DeviceMemory], n: tuple[int, ...], f: tuple[int, ...], s: tuple[int, ...]) -> bool:
    """Whether the split (n, f, s) meets every device's memory constraints, its flag set by its own f."""
    for device in memory:
        values = [x for c in device.chunks for x in (n[c], f[c], s[c])]
        flag = any(f[c] for c in device.chunks)
        for row in device.rows:
            if sum(map(mul, row.coefs, values)) + (row.any_full if flag else 0) > row.limit:
                return False
    return True


def _hint_plan(mdl: cp_model.CpModel, plan: Plan, L: int, n: list, f: list | None, s: list | None) -> None:
    """Start the search from the plan's own split and recomputation (the finalist the analytic
    model ranked), so that a search stopped by the time limit returns nothing worse than it.
    ``f``/``s`` None: the recomputation follows the split (no variables of its own)."""
    for c, (size, (full, sel)) in enumerate(zip(plan.chunk_layers(L), plan.chunk_recompute(L))):
        mdl.add_hint(n[c], size)
        if f is not None and s is not None:
            mdl.add_hint(f[c], full)
            mdl.add_hint(s[c], sel)


def _solved_plan(plan: Plan, L: int, layers: tuple[int, ...], rec: tuple[tuple[int, int], ...] | None) -> Plan:
    """The plan with the solver's split and recomputation (uniform ones left implicit)."""
    ckpt: RecomputeName = plan.ckpt
    if rec is not None:
        summary = _summary_ckpt(rec, layers)
        if summary != "mixed":
            ckpt, rec = summary, None
        else:  # the plan's ckpt names the strongest mode used; recompute= holds the map
            ckpt = "full" if any(f for f, _ in rec) else "selective"
    new = plan.replace(layers=layers, recompute=rec, ckpt=ckpt)
    if new.layers == plan.chunk_layers(L) and plan.layers is None:
        new = new.replace(layers=None)
    return new


def levelled_split(plan: Plan) -> Plan | None:
    """``plan``'s layer split with its middle stages evened out: the first and the last stage
    keep their layers (they also hold the embedding and the head), the others share theirs as
    evenly as whole layers allow, the spare layers on the later stages, which hold fewer
    microbatches in flight. The solver minimizes the pipeline time, which its slowest stage sets
    (module docstring): the other stages' counts are free, and its answer can hold a stage of 1
    layer beside stages of 3 (96 layers on 41 stages: 1/3/3/3/3/1/3/...) where 2/2/3/... is as
    fast. None when there is nothing to level: fewer than three stages, chunks of interleaved or
    V schedules (v > 1), a per-chunk recomputation map, or an even split already."""
    if plan.layers is None or plan.v > 1 or plan.recompute is not None or len(plan.layers) < 3:
        return None
    first, *middle, last = plan.layers
    base, spare = divmod(sum(middle), len(middle))
    even = [base + (i >= len(middle) - spare) for i in range(len(middle))]
    if even == middle:
        return None
    return plan.replace(layers=(first, *even, last))


def _coef(x: float) -> int:
    """Bytes as an integer CP-SAT coefficient (thousandths of a MiB)."""
    return round(x / MIB * 1000)


def _summary_ckpt(rec: tuple[tuple[int, int], ...], layers: tuple[int, ...]) -> RecomputeName | Literal["mixed"]:
    """'none'/'selective'/'full' when every layer got the same mode, else 'mixed'."""
    if all(f == 0 and s == 0 for f, s in rec):
        return "none"
    if all(f == n for (f, _), n in zip(rec, layers)):
        return "full"
    if all(s == n for (_, s), n in zip(rec, layers)):
        return "selective"
    return "mixed"
