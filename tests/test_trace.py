"""simulator.des.trace and simulator.des.plot: a valid Chrome/Perfetto trace and a timeline PNG."""

from __future__ import annotations

import json
import numbers

import pytest

from hwprofiles import load_cluster
from simulator.des import simulate_des
from simulator.des.plot import plot_timeline
from simulator.des.trace import write_trace
from simulator.job import Job
from simulator.plan import parse_plan
from simulator.specs import ModelSpec

MODEL = ModelSpec(name="small", num_layers=8, hidden_size=1024, num_attention_heads=16, vocab_size=4096, seq_length=512)

# Trace Event Format (Google): the required fields of each phase used here
REQUIRED = {
    "X": {"name": str, "ph": str, "ts": numbers.Real, "dur": numbers.Real, "pid": int, "tid": int},
    "C": {"name": str, "ph": str, "ts": numbers.Real, "pid": int, "args": dict},
    "M": {"name": str, "ph": str, "pid": int, "args": dict},
}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def validate(doc: dict) -> list[dict]:
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit") in (None, "ms", "ns")
    for ev in doc["traceEvents"]:
        ph = ev["ph"]
        assert ph in REQUIRED, ev
        for key, typ in REQUIRED[ph].items():
            assert isinstance(ev[key], typ), (key, ev)
        if ph == "X":
            assert ev["dur"] >= 0 and ev["ts"] >= 0
        if ph == "C":
            assert ev["args"] and all(isinstance(v, numbers.Real) for v in ev["args"].values())
        if ph == "M":
            assert ev["name"] in METADATA
            assert ("name" in ev["args"]) if ev["name"].endswith("_name") else ("sort_index" in ev["args"])
    return doc["traceEvents"]


@pytest.fixture(scope="module")
def result():
    cluster = load_cluster("dgx-a100-80gb", 2)
    plan, _ = parse_plan("t=2,p=4,zero=1,ckpt=full", MODEL, cluster.num_gpus, 16)
    return simulate_des(Job.make(MODEL, cluster, plan, 16), trace=True)


def test_trace_is_valid_and_has_the_tracks(result, tmp_path):
    path = tmp_path / "t.json"
    write_trace(result, path)
    events = validate(json.loads(path.read_text()))
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert len([n for n in procs.values() if n.startswith("GPU")]) == result.job.plan.p
    assert "network" in procs.values()
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    names = {n for _, n in threads}
    assert {"compute", "TP collectives", "PP send (forward)", "PP send (backward)", "DP collectives"} <= names
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert "memory" in counters and any(c.endswith("utilization") for c in counters)
    # slices nest: every segment of a compute task lies inside it
    spans = [e for e in events if e["ph"] == "X"]
    assert any(e["cat"] == "recompute" for e in spans) and any(e["cat"] == "pp" for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    assert end == pytest.approx(result.step_time * 1e6, rel=1e-9)


def test_full_run_trace_has_a_process_per_gpu(tmp_path):
    cluster = load_cluster("dgx-a100-80gb", 1)
    plan, _ = parse_plan("t=2,p=2,zero=1", MODEL, cluster.num_gpus, 8)
    r = simulate_des(Job.make(MODEL, cluster, plan, 8), full=True)
    path = tmp_path / "full.json"
    write_trace(r, path)
    events = validate(json.loads(path.read_text()))
    gpus = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(gpus) == cluster.num_gpus + 1  # every GPU, and the network (re-simulated for its series)
    assert "network" in gpus


def test_plot_writes_a_png(result, tmp_path):
    path = tmp_path / "t.png"
    plot_timeline(result, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_analytic_results_have_no_timeline(tmp_path):
    from simulator.analytic import estimate

    cluster = load_cluster("dgx-a100-80gb", 1)
    plan, _ = parse_plan("t=2,p=2", MODEL, cluster.num_gpus, 8)
    r = estimate(Job.make(MODEL, cluster, plan, 8))
    with pytest.raises(ValueError, match="DES"):
        write_trace(r, tmp_path / "x.json")
    with pytest.raises(ValueError, match="DES"):
        plot_timeline(r, tmp_path / "x.png")
