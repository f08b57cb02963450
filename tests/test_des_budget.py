"""The DES time budget (issue 31): simulator.des.budget estimates a run's engine events before it
runs; ``simulate`` and ``plan`` take the analytic estimate, and say why, when the DES would run
past about 20 s, and refuse what only the DES can do (--full, --plot, --trace)."""

from __future__ import annotations

import json

import pytest
from bounded_cli import run_bounded

from hwprofiles.load import load_cluster
from simulator.des import simulate_des
from simulator.des.budget import DES_MAX_EVENTS, estimated_events, estimated_seconds, over_budget
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan

# 4,096 microbatches of one pipeline, each pass split into 32 ZeRO-3 layers: 37 s by the estimate
OVER = ("llama3-8b", "dgx-h100", 1, None, 65536, "t=1,d=8,mb=2,zero=3,offload=cpu,prec=fp8")
OVER_ARGS = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "65536")
OVER_STACK = ("--framework", "megatron")  # a stack that runs OVER's plan (fp8 with ZeRO-3 and offload)


def _job(model: str, cluster: str, nodes: int, seq: int | None, batch: int, plan: str) -> Job:
    m = load_model(model, seq)
    c = load_cluster(cluster, nodes)
    return Job(m, c, parse_plan(plan, m, c.num_gpus, batch)[0], batch)


def test_events_of_whole_passes():
    """gpt3-175b t=8,p=16 on 1024 GPUs, B = 1536: d = 8, m = 192; one pipeline of p = 16 ranks,
    F and B per microbatch, 5 events each: 16 * 192 * 2 * 5 = 30,720; the DES takes 30,113."""
    job = _job("gpt3-175b", "dgx-a100-80gb", 128, None, 1536, "t=8,p=16,ckpt=full")
    assert estimated_events(job) == 30_720
    assert 0.9 * 30_720 <= simulate_des(job).extra["events"] <= 30_720


def test_events_of_zero3_layers_in_the_rank_view():
    """cp=8 is simulated as d*cp = 8 ranks over B*cp = 512 sequence chunks: m = 64; ZeRO-3 splits
    F and B into the 32 layers, 14 events each: 64 * 2 * 32 * 14 = 57,344; the DES takes 57,388."""
    job = _job("llama3-8b", "dgx-h100", 1, 524288, 64, "cp=8,zero=3,ckpt=full,offload=nvme")
    assert estimated_events(job) == 57_344
    assert simulate_des(job).extra["events"] == pytest.approx(57_344, rel=0.05)


def test_events_of_the_full_simulation_count_every_rank():
    """llama3-70b t=8,p=4 on 32 GPUs, B = 128 (d = 1, m = 128): p*d*t = 32 ranks instead of 4."""
    job = _job("llama3-70b", "dgx-h100", 4, None, 128, "t=8,p=4,ckpt=selective,sp=1")
    assert estimated_events(job) == 4 * 128 * 2 * 5
    assert estimated_events(job, full=True) == 32 * 128 * 2 * 5


def test_budget_in_events_and_seconds():
    assert DES_MAX_EVENTS == 2_000_000  # 20 s at 100,000 events/s
    assert estimated_seconds(DES_MAX_EVENTS) == 20.0
    assert estimated_seconds(DES_MAX_EVENTS, workers=2) == 10.0


def test_over_budget_says_why_in_one_line():
    job = _job(*OVER)
    assert estimated_events(job) == 4096 * 2 * 32 * 14  # 3,670,016
    reason = over_budget([job])
    assert reason == "the DES would take about 3,670,016 events (~37 s at 100,000 events/s), over the 20 s budget"
    assert over_budget([job], workers=3) is None  # 12.2 s each on three workers
    assert over_budget([_job("llama2-7b", "dgx-h100", 1, None, 64, "t=2,p=2")]) is None


def test_simulate_over_budget_falls_back_to_analytic():
    proc = run_bounded("simulate", *OVER_ARGS, *OVER_STACK, "--plan", OVER[-1], "--json", deadline_s=60)
    assert proc.returncode in (0, 3), proc.stderr
    out = json.loads(proc.stdout)
    assert out["fidelity"] == "analytic"
    assert out["fidelity_reason"].startswith("the DES would take about 3,670,016 events")
    warning = [line for line in proc.stderr.splitlines() if "DES would take" in line]
    assert warning == [f"autoplan: {out['fidelity_reason']}: using the analytic estimate instead (fidelity analytic)"]
    report = run_bounded("simulate", *OVER_ARGS, *OVER_STACK, "--plan", OVER[-1], deadline_s=60).stdout
    assert f"fidelity  analytic  ({out['fidelity_reason']})" in report


@pytest.mark.parametrize("option", ["--full", "--plot"])
def test_simulate_over_budget_refuses_what_needs_the_des(option, tmp_path):
    extra = [option] if option == "--full" else [option, str(tmp_path / "t.png")]
    proc = run_bounded("simulate", *OVER_ARGS, *OVER_STACK, "--plan", OVER[-1], *extra, deadline_s=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "over the 20 s budget" in line and f"{option} needs the DES" in line
    assert not (tmp_path / "t.png").exists()


def test_plan_over_budget_falls_back_to_analytic():
    """Its eight finalists' DES took 40 s on 2 cores (8.7 million estimated events)."""
    proc = run_bounded("plan", *OVER_ARGS, "--json", deadline_s=60)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert {r["fidelity"] for r in [found["best"], *found["top"]]} == {"analytic"}
    assert "over the 20 s budget" in found["best"]["fidelity_reason"]
    assert sum("DES would take" in line for line in proc.stderr.splitlines()) == 1


def test_plan_over_budget_refuses_plots(tmp_path):
    proc = run_bounded("plan", *OVER_ARGS, "--plot", str(tmp_path / "t.png"), deadline_s=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "over the 20 s budget" in line and "--plot and --trace need the DES" in line
