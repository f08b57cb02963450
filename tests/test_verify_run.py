"""``autoplan emit`` / ``autoplan run`` through the CLI: refusals, a killed worker, the JSON report."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoplan.emit.writer import write_run_dir
from autoplan.verify import run_and_verify
from hwprofiles.errors import InputError
from hwprofiles.load import load_cluster
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan

CLI = [sys.executable, "-m", "autoplan"]


def node_file(tmp_path: Path, gpus: int) -> Path:
    """A one-node cluster file with ``gpus`` A100s (the run itself happens on this machine's CPU)."""
    path = tmp_path / f"node{gpus}.yaml"
    path.write_text(f"""name: test-node
gpu: a100-sxm4-80gb
gpus_per_node: {gpus}
intra_node: {{kind: nvswitch, bandwidth_GBps: 300, latency_us: 3}}
pcie: {{kind: pcie, bandwidth_GBps: 32, latency_us: 2}}
nics_per_node: 0
host_memory_GiB: 512
nvme: {{count: 2, bandwidth_GBps: 3}}
""")
    return path


def emit_data_parallel_run_dir(tmp_path: Path) -> Path:
    """A run dir for the tiny model with plan d=2,zero=1 (two processes)."""
    base = load_cluster("dgx-a100-80gb")
    cluster = base.model_copy(update={"node": base.node.model_copy(update={"gpus_per_node": 2})})
    model = load_model("tiny")
    plan, _ = parse_plan("d=2,zero=1", model, 2, 4)
    write_run_dir(Job(model, cluster, plan, 4), {}, tmp_path / "run")
    return tmp_path / "run"


def test_missing_run_dir_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="no such run directory"):
        run_and_verify(tmp_path / "nope", steps=1, timeout_s=10)
    with pytest.raises(InputError, match=r"plan\.json: no such file"):
        run_and_verify(tmp_path, steps=1, timeout_s=10)


@pytest.mark.parametrize(
    "plan,batch,reason",
    [
        ("d=4,zero=3,offload=nvme", 4, "offload=nvme"),
        ("d=4,zero=1,offload=cpu", 4, "offload=cpu with zero=1"),
        ("p=4,schedule=1f1b", 2, "at least as many microbatches as stages"),
    ],
)
def test_emit_refuses_plans_the_runtime_cannot_run(tmp_path, plan, batch, reason):
    out = tmp_path / "run"
    r = subprocess.run(
        [
            *CLI,
            "emit",
            "--model",
            "tiny",
            "--cluster",
            str(node_file(tmp_path, 4)),
            "--global-batch",
            str(batch),
            "--plan",
            plan,
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert (
        r.stderr.count("\n") == 1 and "torch program cannot run this plan correctly" in r.stderr and reason in r.stderr
    )
    assert not out.exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.timeout(240)
def test_killed_worker_fails_the_run_with_the_rank_named(tmp_path):
    run_dir = emit_data_parallel_run_dir(tmp_path)
    start = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "run", str(run_dir), "--steps", "100000", "--timeout", "180"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not any("timed step" in f.read_text() for f in run_dir.glob("results/run-*/rank1.log")):
            assert proc.poll() is None and time.monotonic() - start < 150, "run did not reach its timed steps"
            time.sleep(0.2)
        (log,) = run_dir.glob("results/run-*/rank1.log")
        pids = {
            int(r): int(p)
            for r, p in (
                re.search(r"\[rank (\d)\] \S+ pid (\d+)", f.read_text()).groups() for f in log.parent.glob("rank*.log")
            )
        }
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert time.monotonic() - killed < 60
    line = err.strip().splitlines()[-1]
    assert line.startswith("autoplan: error: worker rank 1 failed (killed by SIGKILL)"), err
    assert "[rank 1]" in line and "timed step" in line
    assert not any(_alive(p) for p in pids.values())


@pytest.mark.timeout(300)
def test_cli_emit_then_run_json(tmp_path):
    out = tmp_path / "run"
    emit = subprocess.run(
        [
            *CLI,
            "emit",
            "--model",
            "tiny",
            "--cluster",
            str(node_file(tmp_path, 2)),
            "--global-batch",
            "4",
            "--plan",
            "t=2,ckpt=selective",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert emit.returncode == 0, emit.stderr
    assert (out / "plan.json").is_file() and json.loads((out / "plan.json").read_text())["prediction"][
        "step_time_s"
    ] > 0
    run = subprocess.run([*CLI, "run", str(out), "--steps", "2", "--json"], capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["loss_match"] is True and result["max_rel_loss_diff"] <= 1e-4
    assert result["measured_step_time_s"] > 0 and result["measured_peak_memory_gib"] > 0
    assert result["device"] == "cpu" and result["world_size"] == 2 and len(result["ranks"]) == 2
    if result["predicted_step_time_s"] is not None:
        expected = (
            100 * (result["measured_step_time_s"] - result["predicted_step_time_s"]) / result["predicted_step_time_s"]
        )
        assert result["error_pct"] == pytest.approx(expected)
        # the host speed check: this host now against the node's profile, and the prediction at that speed
        assert result["host_speed"] > 0 and result["host_gemm_tflops"] > 0 and result["host_layer_us"] > 0
        at_speed = result["predicted_step_time_s"] / result["host_speed"]
        assert result["predicted_step_time_at_host_speed_s"] == pytest.approx(at_speed)
