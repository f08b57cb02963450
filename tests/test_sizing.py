"""Cluster sizing (autoplan.sizing, ``autoplan plan --nodes A:B``): the failure model against
hand-derived figures, the node-count syntax, the choice among sizes, and the command line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from autoplan.sizing.failures import checkpoint_seconds, daly_interval_s, expected_wall_factor, job_mtbf_s
from autoplan.sizing.report import pareto, short_plan
from autoplan.sizing.sizes import parse_node_counts
from autoplan.sizing.sweep import Goal, SizeRow, choose
from hwprofiles.errors import InputError
from hwprofiles.schema import Reliability


def test_default_failure_rate_gives_llama3_interruption_interval():
    # 419 interruptions in 54 days: one every 54 * 24 / 419 = 3.093 hours on 16,384 GPUs; the
    # default rate, rounded to 1.97e-5, gives 3600 / (1.97e-5 * 16384) s = 3.098 h
    rate = Reliability().failures_per_gpu_hour
    assert job_mtbf_s(rate, 16384) / 3600 == pytest.approx(54 * 24 / 419, rel=0.005)
    assert job_mtbf_s(rate, 1) == pytest.approx(3600 / 1.97e-5)


def test_checkpoint_seconds_by_hand():
    # 2 TB over 1,000 GPUs writing 0.1 GB/s each: 2e12 / 1e11 = 20 s
    assert checkpoint_seconds(2e12, 1000, 0.1) == pytest.approx(20.0)


def test_daly_interval_by_hand():
    # delta = 60 s, M = 10 h: sqrt(2 * 60 * 36000) = 2078.46; x = 60 / 72000 = 8.333e-4;
    # 2078.46 * (1 + sqrt(x) / 3 + x / 9) - 60 = 2038.65
    assert daly_interval_s(60.0, 36000.0) == pytest.approx(2038.65, abs=0.01)
    assert daly_interval_s(100.0, 40.0) == 40.0  # a dump longer than 2M: checkpoint every M


def test_expected_wall_factor_by_hand():
    # tau = 1000, delta = 50, R = 300, M = 10000: 10000 e^0.03 (e^0.105 - 1) / 1000 = 1.14082
    assert expected_wall_factor(1000.0, 50.0, 300.0, 10000.0) == pytest.approx(1.14082, abs=1e-5)
    # no interruptions: only the dumps, (tau + delta) / tau
    assert expected_wall_factor(1000.0, 50.0, 300.0, 1e12) == pytest.approx(1.05, rel=1e-6)


def test_daly_interval_is_the_optimum_of_the_wall_factor():
    dump, restart, mtbf = 120.0, 600.0, 20000.0
    best = daly_interval_s(dump, mtbf)
    f = expected_wall_factor(best, dump, restart, mtbf)
    assert f < expected_wall_factor(0.8 * best, dump, restart, mtbf)
    assert f < expected_wall_factor(1.25 * best, dump, restart, mtbf)


@pytest.mark.parametrize(
    ("text", "counts"),
    [("8", [8]), ("16:64:16", [16, 32, 48, 64]), ("3:5", [3, 4, 5]), ("4,2,2", [2, 4]), (" 2 , 1", [1, 2])],
)
def test_node_counts(text, counts):
    assert parse_node_counts(text) == counts


# 1:10**20 would be a list of 10**20 counts if built before the size check
@pytest.mark.parametrize("text", ["a", "5:2", "0:3", "1:2:0", "2:", "1:2:3:4", "0", "1:5000", "1:99999999999999999999"])
def test_bad_node_counts_are_one_line(text):
    with pytest.raises(InputError) as e:
        parse_node_counts(text)
    assert "\n" not in str(e.value) and str(e.value).startswith("--nodes")


def _row(nodes: int, tokens_per_s: float, goodput: float, days: float | None = None, late: bool | None = None):
    return SizeRow(
        nodes, 8 * nodes, "t=8", 1.0, tokens_per_s, 0.5, 10.0, 600.0, 100.0, goodput, days, days, None, None, late
    )


def test_choice_by_time_cost_and_deadline():
    rows = [_row(1, 1000.0, 0.99), _row(2, 1900.0, 0.98), _row(4, 3000.0, 0.97)]
    assert choose(rows, Goal(objective="time")).nodes == 4  # most work per second
    assert choose(rows, Goal(objective="cost")).nodes == 1  # 8 / 990 GPU-s per token is the least
    late = [_row(1, 1000.0, 0.99, 30.0, False), _row(2, 1900.0, 0.98, 16.0, True), _row(4, 3000.0, 0.97, 10.0, True)]
    assert choose(late, Goal(tokens=1.0, deadline_days=20.0, objective="cost")).nodes == 2  # cheapest in time
    assert choose([late[0]], Goal(tokens=1.0, deadline_days=20.0)) is None


def test_pareto_and_short_plan():
    # (cost, days): (3, 1) and (1, 3) are the frontier; (2, 4) is beaten by (1, 3)
    assert pareto([(3.0, 1.0), (2.0, 4.0), (1.0, 3.0)]) == [2, 0]
    assert short_plan("t=4,p=2,d=1,mb=1,zero=1,ckpt=none,v=1,schedule=1f1b,offload=none,sp=0") == (
        "t=4,p=2,d=1,mb=1,zero=1,ckpt=none,schedule=1f1b"
    )


def _plan(*args: str) -> subprocess.CompletedProcess:
    base = ["--model", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "64", "--fidelity", "analytic"]
    return subprocess.run(
        [sys.executable, "-m", "autoplan", "-q", "plan", *base, "--jobs", "1", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_sweep_on_the_command_line(tmp_path):
    png = tmp_path / "sizes.png"
    done = _plan("--nodes", "1,2", "--tokens", "1e11", "--gpu-hour-price", "2", "--deadline", "60", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    rows = out["sizes"]
    assert [r["nodes"] for r in rows] == [1, 2] and [r["gpus"] for r in rows] == [8, 16]
    for r in rows:
        assert r["days"] == pytest.approx(1e11 / r["tokens_per_s"] / 86400)
        assert r["days_with_failures"] > r["days"] and 0.9 < r["goodput"] < 1
        assert r["gpu_hours"] == pytest.approx(r["gpus"] * r["days_with_failures"] * 24)
        assert r["cost"] == pytest.approx(2 * r["gpu_hours"])
    in_time = [r for r in rows if r["days_with_failures"] <= 60]
    want = min(in_time, key=lambda r: r["gpu_hours"]) if in_time else None  # --deadline: cost by default
    assert (out["choice"] or {}).get("nodes") == (want or {}).get("nodes")
    text = _plan("--nodes", "1:2", "--tokens", "1e11", "--plot", str(png))
    assert text.returncode == 0, text.stderr
    assert "choice (fastest, interruptions priced in)" in text.stdout and png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "1:2", "--deadline", "30"], "--deadline needs --tokens"),
        (["--nodes", "1:2", "--plot", "x.png"], "--plot over several sizes"),
        (["--nodes", "2:1"], "--nodes 2:1"),
        (["--nodes", "1:2", "--tokens", "-5"], "expected a positive number"),
    ],
)
def test_sweep_errors_are_one_line(args, message, tmp_path):
    done = _plan(*[a if a != "x.png" else str(tmp_path / a) for a in args])
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_checkpoint_bytes_are_weights_and_optimizer_state():
    # autoplan's program keeps fp32 weights and Adam's two moments: 4 + 8 = 12 bytes per parameter;
    # mixed precision (Megatron-LM, DeepSpeed) bf16 weights, fp32 master weights and moments: 2 + 12
    from autoplan.runtime.support import program_job
    from autoplan.sizing.sweep import checkpoint_bytes
    from hwprofiles.load import load_cluster
    from simulator import simulate
    from simulator.cost.params import total_params
    from simulator.job import Job
    from simulator.model_files import load_model
    from simulator.plan import parse_plan

    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 1)
    plan, _ = parse_plan("t=8,p=1,zero=1", model, 8, 64)
    mixed = Job.make(model, cluster, plan, 64)
    assert checkpoint_bytes(model, simulate(mixed, "analytic")) == pytest.approx(14 * total_params(model))
    program = simulate(program_job(mixed), "analytic")
    assert checkpoint_bytes(model, program) == pytest.approx(12 * total_params(model))


def test_sizes_planned_by_workers_are_the_sizes_planned_in_one_process():
    """The sweep shares its sizes among worker processes (each size searched whole, jobs = 1
    inside): the rows and the skipped sizes are those of one process, and a size no plan can use
    comes back through the pool as its one-line reason (gpt3-175b on 97 DGX A100 nodes: 776 GPUs
    = 8 * 97, p <= 96 layers, d dividing B = 1536, t dividing the heads: none)."""
    from autoplan.frameworks import load_framework
    from autoplan.search import SearchOptions
    from autoplan.sizing.sweep import sweep
    from hwprofiles.errors import PlanError
    from hwprofiles.load import load_cluster
    from simulator.model_files import load_model

    fw = load_framework("autoplan")
    opts = SearchOptions(top=1, fidelity="analytic", framework=fw)
    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 1)
    one, two = (sweep(model, cluster, 64, [1, 2, 3], dataclasses.replace(opts, jobs=j), Goal()) for j in (1, 2))
    assert [r.to_dict() for r in two.rows] == [r.to_dict() for r in one.rows] and len(one.rows) == 3
    big = load_model("gpt3-175b")
    with pytest.raises(PlanError, match="no valid plan for 776 GPUs"):
        sweep(big, load_cluster("dgx-a100-80gb", 97), 1536, [97, 101], dataclasses.replace(opts, jobs=2), Goal())


def test_skipped_sizes_are_one_short_line():
    """A sweep over hundreds of sizes can skip hundreds (175B over 16..512 nodes: 228 node counts
    no plan can use); the table's line names the first twelve and gives the first one's reason."""
    from autoplan.sizing.report import format_sweep

    row = SizeRow(1, 8, "t=1,p=1,d=8,mb=1,zero=0", 1.0, 1e5, 0.5, 10.0, 3600.0, 100.0, 0.99)
    skipped = [{"nodes": n, "reason": f"no valid plan for {8 * n} GPUs"} for n in range(2, 16)]
    out = {"sizes": [row.to_dict()], "skipped": skipped, "choice": row.to_dict(), "goal": dataclasses.asdict(Goal())}
    text = format_sweep({**out, "search_time_s": 1.0}).splitlines()
    line = next(x for x in text if x.startswith("skipped"))
    assert line == (
        "skipped 14 size(s) (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13 and 2 more; --json gives each reason): "
        "2 nodes: no valid plan for 16 GPUs"
    )
    assert text[-1] == "planned 1 size in 1.0 s"
