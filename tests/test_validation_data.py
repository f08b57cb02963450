"""The public reference data ships with the repository (validation/), so a fresh clone runs every
benchmark and test: each file loads and holds the rows its header and README describe."""

from __future__ import annotations

import csv
import subprocess
import sys

import yaml
from conftest import REPO, VALIDATION_DIR


def test_published_yaml():
    data = yaml.safe_load((VALIDATION_DIR / "published.yaml").read_text())
    assert len(data["zero_model_state_memory"]) == 4
    rows = data["megatron_2021_throughput"]
    assert len(rows) >= 5 and all({"tflops_per_gpu", "t", "p", "gpus", "batch"} <= set(r) for r in rows)


def test_published_fsdp_yaml_has_its_162_rows_with_sources():
    text = (VALIDATION_DIR / "published-fsdp.yaml").read_text()
    data = yaml.safe_load(text)
    sources = [k for k, v in data.items() if isinstance(v, dict) and "rows" in v]
    assert sum(len(data[k]["rows"]) for k in sources) == 162
    assert all(f"#  {k}:" in text for k in sources)  # every source is cited in the header


def test_vtrain_csvs():
    counts = {}
    for name in ("ground_truth_single.csv", "ground_truth_multi.csv"):
        with open(VALIDATION_DIR / "vtrain" / name) as f:
            counts[name] = sum(1 for _ in csv.DictReader(f))
    assert counts == {"ground_truth_single.csv": 1440, "ground_truth_multi.csv": 109}
    assert (VALIDATION_DIR / "vtrain" / "LICENSE").is_file()


def test_the_sources_are_listed():
    readme = (REPO / "validation" / "README.md").read_text()
    assert all(name in readme for name in ("published.yaml", "published-fsdp.yaml", "vtrain"))


def test_accuracy_benchmark_runs_from_the_repository_alone(tmp_path):
    """benchmarks/accuracy.py with no AUTOPLAN_VALIDATION_DIR, from another folder: it reads the
    in-repo data (it used to need ../shared/validation beside the checkout). Without the DES
    columns (30 s of the 40): tests/test_accuracy_smoke.py predicts a published FSDP row of each
    source through the DES column's path, and notebook 03 simulates the Megatron rows with it."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "accuracy.py"), "--no-cpu-runs", "--no-des"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "published Megatron rows: MAPE" in r.stdout and "vTrain multi-node:  MAPE" in r.stdout
