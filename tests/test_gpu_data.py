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


def _rows() -> list[dict]:
    return [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()]


def test_every_recorded_run_ran_on_cuda_with_its_measurements():
    rows = _rows()
    assert len(rows) == 20 and not [r for r in rows if "error" in r]
    for r in rows:
        assert r["device"] == "cuda" and r["backend"] == "nccl" and r["world_size"] == 1
        assert r["measured_step_time_s"] > 0 and 0 < r["measured_peak_memory_gib"] <= r["measured_peak_reserved_gib"]
    checked = [r for r in rows if r.get("loss_match") is not None]
    assert [r["loss_match"] for r in checked] == [True]  # the fp32 SGD check against the CPU reference


def test_compare_repredicts_every_run(capsys):
    assert gpu_compare.main(["--runs", str(RUNS)]) == 0
    out = capsys.readouterr().out
    assert sum(1 for r in _rows() if r["case"] in out) == 20
    assert "step time (1B and 7B-slice runs, no offload): MAPE" in out and "over 18 runs" in out
