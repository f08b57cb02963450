"""``simulate_des``: discrete-event simulation of one training iteration (docs/design.md section 4).

Builds the topology (:mod:`simulator.des.topology`), the flow network (:mod:`simulator.des.network`)
and the iteration's task graph (:mod:`simulator.des.program`) on the event engine
(:mod:`simulator.des.engine`), runs it, and turns what happened into a :class:`SimResult`
with ``fidelity = "des"``:

* ``step_time``: when the last task of the iteration ends;
* ``time_breakdown`` and ``bubble_fraction`` (= bubble / (compute + recompute + tp_comm + cp_comm + ep_comm))
  of the rank that finishes last (:mod:`simulator.des.attribution`);
* ``peak_memory`` and ``memory_breakdown``: the highest point of any simulated rank's
  memory timeline (:mod:`simulator.des.memtimeline`), against the GPU's usable memory;
* ``executed_flops``: model FLOPs plus the recomputed forwards the schedule really ran.

``extra`` carries ``events``, ``simulated_ranks``, ``bottleneck_link`` (the link with the
highest average utilization), ``comm_bytes_per_rank`` (what the first rank sends per
iteration: TP, PP, DP and offload bytes), ``critical_rank``, and under the private key
``_des`` a :class:`DesRecord` (task records, memory timelines, link series) that
:func:`simulator.des.trace.write_trace` and :func:`simulator.des.plot.plot_timeline` draw from.
Keys starting with "_" are not part of the JSON output.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from hwprofiles.schema import ClusterSpec
from hwprofiles.units import GiB
from simulator.cost.rank_view import rank_job
from simulator.cost.step import host_fits, host_state_bytes, local_params
from simulator.cost.workload import layer_forward_flops, model_flops_per_iteration
from simulator.des.attribution import rank_breakdown
from simulator.des.engine import Engine
from simulator.des.memtimeline import RankMemory
from simulator.des.network import Network
from simulator.des.program import DesOptions, Device, Program, build_program
from simulator.des.topology import Topology
from simulator.gc_pause import paused_gc
from simulator.job import Job
from simulator.result import SimResult

_TOPO_CACHE: list[tuple[str, Topology]] = []


def topology_for(cluster: ClusterSpec) -> Topology:
    """The cluster's topology, built once per distinct cluster (the planner simulates many
    plans on one cluster); the last four are kept."""
    key = cluster.model_dump_json()
    for k, topo in _TOPO_CACHE:
        if k == key:
            return topo
    topo = Topology(cluster)
    _TOPO_CACHE.insert(0, (key, topo))
    del _TOPO_CACHE[4:]
    return topo


@dataclass
class DesRecord:
    """Everything the trace and plot writers need from one DES run."""

    engine: Engine
    topology: Topology
    devices: list[Device]
    lanes: dict[int, tuple[int, str]]
    memory: list[RankMemory]
    link_series: dict[int, list[tuple[float, float]]]
    link_utilization: dict[int, float]
    step_time: float
    critical_rank: int
    counters: dict[str, float]
    wall_s: float
    full: bool
    schedule: str
    num_microbatches: int
    links_recorded: bool
    options: DesOptions
    breakdowns: dict[int, dict[str, float]] = field(default_factory=dict)


@dataclass
class _Iteration:
    """One simulated iteration: the topology, flow network, engine and task graph it ran on, the
    step time and each simulated rank's memory timeline."""

    topo: Topology
    net: Network
    eng: Engine
    prog: Program
    step: float
    memory: list[RankMemory]


def _run_iteration(job: Job, full: bool, trace: bool, opts: DesOptions) -> _Iteration:
    """Build the topology, network, engine and program of ``job`` and run the iteration."""
    topo = topology_for(job.cluster)
    net = Network(topo.cap, record=opts.record_links or trace)
    eng = Engine(net)
    with paused_gc():  # task records by the ten thousand, no cycles among them
        prog = build_program(job, topo, eng, full, opts)
        step = eng.run()
        memory = prog.mem.replay(eng.start, eng.end)
    return _Iteration(topo, net, eng, prog, step, memory)


def _critical_rank(it: _Iteration) -> tuple[int, dict[str, float], float]:
    """The rank that finishes last (by its last task): its index, its time breakdown and its
    bubble fraction (bubble / (compute + recompute + tp_comm + cp_comm + ep_comm))."""
    eng = it.eng
    final_task = eng.end.index(max(eng.end))  # the first task to end last
    crit = eng.info[final_task].device
    breakdown = rank_breakdown(eng, it.prog.devices[crit].streams["compute"], final_task)
    busy = sum(breakdown[k] for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm"))
    bubble_fraction = breakdown["bubble"] / busy if busy > 0 else 0.0
    return crit, breakdown, bubble_fraction


def _des_record(
    job: Job,
    it: _Iteration,
    util: dict[int, float],
    crit: int,
    breakdown: dict[str, float],
    full: bool,
    opts: DesOptions,
    wall: float,
) -> DesRecord:
    """What the trace and plot writers keep of the iteration (``extra['_des']``)."""
    return DesRecord(
        engine=it.eng,
        topology=it.topo,
        devices=it.prog.devices,
        lanes=it.prog.lanes,
        memory=it.memory,
        link_series=it.net.series,
        link_utilization=util,
        step_time=it.step,
        critical_rank=crit,
        counters=dict(it.prog.counters),
        wall_s=wall,
        full=full,
        schedule=job.plan.schedule,
        num_microbatches=job.m,
        links_recorded=it.net.record,
        options=opts,
        breakdowns={crit: breakdown},
    )


def simulate_des(job: Job, full: bool = False, trace: bool = False, options: DesOptions | None = None) -> SimResult:
    """Simulate one iteration of ``job``. ``full`` simulates every rank instead of one
    pipeline; ``trace`` keeps link-utilization series for the Perfetto trace (task records
    and memory timelines are always kept; :func:`simulator.des.trace.write_trace` re-runs the
    simulation with ``trace=True`` when the series are missing). A context- or expert-parallel
    plan is simulated as one rank sees it (simulator.cost.rank_view.rank_job) and reported as given."""
    view = rank_job(job)
    if view is not job:
        return dataclasses.replace(simulate_des(view, full, trace, options), job=job)
    t0 = time.perf_counter()
    opts = options or DesOptions()
    it = _run_iteration(job, full, trace, opts)
    crit, breakdown, bubble_fraction = _critical_rank(it)
    pm = it.memory[max(range(len(it.memory)), key=lambda r: (it.memory[r].peak, -r))]
    model_flops = model_flops_per_iteration(job.model, job.global_batch)
    executed = _executed_flops(job, it.prog, model_flops)
    util = it.net.utilization(it.step)
    extra = _summary(it.prog, it.topo, it.eng, util, it.prog.devices[crit])
    extra["_des"] = _des_record(job, it, util, crit, breakdown, full, opts, wall=time.perf_counter() - t0)
    fits_host = _host_memory_fits(job, it.prog, extra)
    return SimResult(
        job=job,
        step_time=it.step,
        peak_memory=pm.peak,
        memory_capacity=job.cluster.gpu.usable_memory_bytes,
        time_breakdown=breakdown,
        memory_breakdown=dict(pm.breakdown),
        executed_flops=executed,
        model_flops=model_flops,
        bubble_fraction=bubble_fraction,
        fidelity="des",
        extra=extra,
        host_fits=fits_host,
    )


def _executed_flops(job: Job, prog: Program, model_flops: float) -> float:
    """Model FLOPs plus the recomputed layers' (full: a layer forward; selective: the attention
    core, 4*b*s*S*h with S the keys, workload.executed_flops_per_iteration) over the d pipeline
    replicas."""
    model, plan = job.model, job.plan
    attn_core = 4.0 * plan.mb * model.seq_length * model.attention_keys * model.hidden_size
    return model_flops + plan.d * (
        prog.recomputed["full"] * layer_forward_flops(model, plan.mb) + prog.recomputed["selective"] * attn_core
    )


def _summary(prog: Program, topo: Topology, eng: Engine, util: dict[int, float], crit_dev: Device) -> dict[str, Any]:
    """The result's extra keys: events, simulated ranks, critical rank, bytes per rank, busiest link."""
    extra: dict[str, Any] = {
        "events": eng.events,
        "simulated_ranks": len(prog.devices),
        "critical_rank": crit_dev.name,
        "comm_bytes_per_rank": {k: prog.counters[k] for k in ("tp_bytes", "pp_bytes", "dp_bytes", "offload_bytes")},
        "bottleneck_link": None,
    }
    if util:
        lid = max(util, key=lambda k: (util[k], -k))
        info = topo.links[lid]
        extra["bottleneck_link"] = {"link": info.name, "kind": info.kind, "utilization": util[lid]}
    return extra


def des_record(result: SimResult, trace: bool = False) -> DesRecord:
    """The DES record of a result (``extra['_des']``); a DES result that dropped it (the planner
    does not send records back from its workers) is simulated again (deterministic), as is one
    without link series when ``trace`` needs them."""
    rec = result.extra.get("_des")
    if rec is None and result.fidelity != "des":
        raise ValueError("the result has no DES record (simulate with fidelity 'des')")
    if rec is None or (trace and not rec.links_recorded):
        full = (
            rec.full if rec is not None else result.extra.get("simulated_ranks", 0) >= result.job.cluster.num_gpus > 1
        )
        options = rec.options if rec is not None else None
        rec = simulate_des(result.job, full=full, trace=trace, options=options).extra["_des"]
    return rec


def _host_memory_fits(job: Job, prog: Program, extra: dict[str, Any]) -> bool:
    """With offload, a node's ranks keep fp32 state (+ fp16 parameters with ZeRO-3) in host
    memory, as simulator.analytic counts it (:func:`simulator.cost.step.host_state_bytes`); the
    figure goes to ``extra["host_memory_gib"]``."""
    if job.plan.offload == "none":
        return True
    psi = max(prog.device_params(dev) for dev in prog.devices)
    psi_sharded = max(prog.device_sharded_params(dev) for dev in prog.devices)
    plan = job.plan
    host = host_state_bytes(
        job.cluster.gpus_per_node, local_params(psi, plan.zero, plan.shard_group, psi_sharded), plan.zero
    )
    extra["host_memory_gib"] = host / GiB
    return bool(host_fits(job.cluster.node, host, True, plan.offload == "nvme"))
