"""Chrome / Perfetto trace of a DES run (Trace Event Format, JSON object form).

One process per simulated GPU, with threads for the compute stream, tensor-parallel
collectives, pipeline sends (forward and backward), data-parallel and ZeRO collectives,
offload traffic and the host CPU optimizer; a memory counter track per GPU; and a "network"
process with one utilization counter per link that carried traffic (recorded with
``simulate_des(..., trace=True)``; a result without them is re-simulated). Times are
microseconds. Open the file in
https://ui.perfetto.dev or chrome://tracing.

Format: Google, "Trace Event Format" (the ``traceEvents`` array; phases ``X`` complete
events, ``C`` counters, ``M`` metadata).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.des.simulate import DesRecord, des_record
from simulator.plan import Plan
from simulator.result import GiB, SimResult

# lane -> (thread id, thread name)
THREADS = {
    "compute": (1, "compute"),
    "tp": (2, "TP collectives"),
    "pp_fwd": (3, "PP send (forward)"),
    "pp_bwd": (4, "PP send (backward)"),
    "dp": (5, "DP collectives"),
    "zero": (6, "ZeRO-3 gathers"),
    "h2d": (7, "offload host->GPU"),
    "d2h": (8, "offload GPU->host"),
    "nvme": (9, "NVMe read"),
    "nvme_w": (10, "NVMe write"),
    "cpu": (11, "host CPU optimizer"),
    "cp": (12, "CP ring (K/V exchange)"),
    "ep": (13, "EP all-to-all (tokens)"),
}
SEGMENT_NAMES = {
    "fwd": "forward",
    "bwd": "backward",
    "recompute": "recompute",
    "tp": "TP collective",
    "cp": "CP ring: K/V exchange beside the attention",
    "ep": "EP all-to-all: token dispatch / combine",
    "opt": "optimizer step",
    "dp": "slowed by DP/ZeRO traffic (contention, FSDP2 copy-out)",
}
US = 1e6


def _task_name(kind: str, info: Any) -> str:
    if kind in ("F", "B", "W"):
        name = {"F": "fwd", "B": "bwd", "W": "weight grad"}[kind]
        return f"{name} mb{info.microbatch} c{info.chunk}"
    if kind == "opt":
        return "optimizer step"
    return f"{info.label} mb{info.microbatch}" if info.microbatch >= 0 else info.label


def _metadata_events(rec: DesRecord, plan: Plan) -> list[dict[str, Any]]:
    """Each simulated GPU's process name and order, and its lanes' thread names and order (the
    TP, CP and EP lanes whenever the plan has those collectives)."""
    ev: list[dict[str, Any]] = []
    for dev in rec.devices:
        pid = dev.idx + 1
        ev.append(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"GPU {dev.gpu} ({dev.name})"}}
        )
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": dev.idx}})
        lanes = set(dev.streams) | {k for k, on in (("tp", plan.t > 1), ("cp", plan.cp > 1), ("ep", plan.ep > 1)) if on}
        for lane in sorted(lanes, key=lambda x: THREADS[x][0]):
            tid, tname = THREADS[lane]
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tname}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return ev


def _segment_events(info: Any, pid: int, tid: int, start: float, dur: float) -> list[dict[str, Any]]:
    """A compute task's segments, one complete event each, nested inside the task (the TP, CP
    and EP segments on their own lanes)."""
    ev: list[dict[str, Any]] = []
    t = start * US
    stop = t + max(dur, 0.0) * US
    for seg, d in info.segments:
        d = min(d * US, stop - t)  # nest inside the task despite rounding
        ev.append(
            {
                "ph": "X",
                "name": SEGMENT_NAMES[seg],
                "cat": seg,
                "pid": pid,
                "tid": THREADS[seg][0] if seg in ("tp", "cp", "ep") else tid,
                "ts": t,
                "dur": max(d, 0.0),
            }
        )
        t += d
    return ev


def _task_events(rec: DesRecord) -> list[dict[str, Any]]:
    """Every task of every stream as a complete event on its lane, each compute task followed by
    its segments."""
    eng = rec.engine
    ev: list[dict[str, Any]] = []
    for s, (didx, lane) in rec.lanes.items():
        pid = didx + 1
        tid = THREADS[lane][0]
        for task in eng.stream_queue[s]:
            start, dur, kind, info = eng.start[task], eng.dur[task], eng.kind[task], eng.info[task]
            name = _task_name(kind, info)
            ev.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": kind,
                    "pid": pid,
                    "tid": tid,
                    "ts": start * US,
                    "dur": max(dur, 0.0) * US,
                }
            )
            if lane != "compute":
                continue
            ev += _segment_events(info, pid, tid, start, dur)
    return ev


def _counter_events(rec: DesRecord) -> list[dict[str, Any]]:
    """Each GPU's memory counter, then (when link series were recorded) the "network" process
    with one utilization counter per link."""
    ev: list[dict[str, Any]] = []
    for dev, mem in zip(rec.devices, rec.memory):
        for t, total in zip(mem.times, mem.totals):
            ev.append(
                {"ph": "C", "name": "memory", "pid": dev.idx + 1, "tid": 0, "ts": t * US, "args": {"GiB": total / GiB}}
            )
    if rec.link_series:
        npid = len(rec.devices) + 1
        ev.append({"ph": "M", "name": "process_name", "pid": npid, "tid": 0, "args": {"name": "network"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": npid, "tid": 0, "args": {"sort_index": npid}})
        for lid in sorted(rec.link_series):
            name = f"{rec.topology.links[lid].name} utilization"
            for t, u in rec.link_series[lid]:
                ev.append({"ph": "C", "name": name, "pid": npid, "tid": 0, "ts": t * US, "args": {"util": u}})
    return ev


def trace_events(result: SimResult) -> list[dict[str, Any]]:
    """The trace events of a DES result (see module docstring)."""
    rec = des_record(result, trace=True)
    return _metadata_events(rec, result.job.plan) + _task_events(rec) + _counter_events(rec)


def write_trace(result: SimResult, path: str | Path) -> None:
    """Write the Chrome/Perfetto trace JSON of a DES result to ``path``."""
    doc = {
        "traceEvents": trace_events(result),
        "displayTimeUnit": "ms",
        "otherData": {
            "model": result.job.model.name,
            "cluster": result.job.cluster.name,
            "plan": result.job.plan.to_string(),
            "step_time_s": result.step_time,
            "simulated_ranks": result.extra.get("simulated_ranks"),
        },
    }
    Path(path).write_text(json.dumps(doc, separators=(",", ":")))
