"""The committed single-GPU measurements (benchmarks/data/, made by benchmarks/gpu_runs.py on
an H100) stay readable, and benchmarks/gpu_compare.py re-predicts every one of them.

No accuracy is asserted (the benchmark prints it); these checks catch a broken record or a
prediction path that no longer accepts a recorded plan.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_compare  # noqa: E402  (benchmarks/ on the path above)

RUNS = BENCH / "data" / "h100-runs.jsonl"
FUSED = BENCH / "data" / "h100-runs-fused.jsonl"  # the ckpt=full 7B runs again with fused AdamW


def _rows(path: Path = RUNS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_every_recorded_run_ran_on_cuda_with_its_measurements():
    rows = _rows()
    assert len(rows) == 20 and not [r for r in rows if "error" in r]
    for r in rows:
        assert r["device"] == "cuda" and r["backend"] == "nccl" and r["world_size"] == 1
        assert r["measured_step_time_s"] > 0 and 0 < r["measured_peak_memory_gib"] <= r["measured_peak_reserved_gib"]
    checked = [r for r in rows if r.get("loss_match") is not None]
    assert [r["loss_match"] for r in checked] == [True]  # the fp32 SGD check against the CPU reference


def test_the_fused_reruns_are_the_ckpt_full_7b_cases():
    rows = _rows(FUSED)
    assert [r["case"] for r in rows] == [
        r["case"] for r in _rows() if r["model"] == "llama2-7b-8layers" and "full" in r["case"]
    ]
    assert all(r["device"] == "cuda" and r["measured_step_time_s"] > 0 for r in rows)


SESSION = BENCH / "data" / "h100-2026-11-26b"  # benchmarks/gpu_session.sh's run, 2026-11-26


def test_the_session_recorded_the_independent_set_and_the_small_microbatches():
    rows = _rows(SESSION / "runs.jsonl")
    done = [r for r in rows if "error" not in r]
    assert {r["group"] for r in done} == {"shared", "host"} and len(done) == 10
    assert all(r["device"] == "cuda" and r["measured_step_time_s"] > 0 for r in done)
    # the offload run is recorded as what happened: it did not finish its steps in time
    assert [r["case"] for r in rows if "error" in r] == [
        "llama7b-slice/B=8/t=1,p=1,d=1,mb=1,zero=3,ckpt=none,offload=cpu"
    ]


def test_compare_repredicts_every_run(capsys):
    assert gpu_compare.main(["--runs", str(RUNS), str(FUSED), "--gpu", "built-in"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cases = {line.split()[0] for line in lines if "/B=" in line}
    assert cases == {r["case"] for r in _rows() + _rows(FUSED)}  # one printed row per run (23 runs, 20 cases)
    summaries = [line for line in lines if line.startswith("step time (1B and 7B-slice runs, no offload): MAPE")]
    assert len(summaries) == 2 and "over 18 runs" in summaries[0] and "over 3 runs" in summaries[1]
