"""``autoplan.verify`` diagnosis helpers on fabricated logs (the real runs are in test_verify_run)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from autoplan.launch import _failed_rank, _hang_culprit
from autoplan.runtime.config import RunSpec
from autoplan.verify import compare, format_report, summarize, with_host_speed
from hwprofiles.calibrate.speed import HostSpeed
from simulator.model_files import load_model
from simulator.plan import Plan

TORCHRUN_TAIL = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 11)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 12)  (SIGKILL)
"""


def _logs(out: Path, lines: dict[int, list[str]]) -> None:
    for r, ls in lines.items():
        (out / f"rank{r}.log").write_text("".join(f"[rank {r}] 00:00:0{i} {line}\n" for i, line in enumerate(ls)))


def test_failed_rank_is_torchruns_root_cause_not_the_collateral_failure(tmp_path):
    _logs(tmp_path, {0: ["pid 11 start"], 1: ["pid 12 start", "timed step 1/9"]})
    (tmp_path / "rank0.log").open("a").write("[rank 0] FAILED: RuntimeError('Connection reset by peer')\n")
    (tmp_path / "torchrun.log").write_text(TORCHRUN_TAIL)
    assert _failed_rank(tmp_path, tmp_path / "torchrun.log", 2) == (1, "killed by SIGKILL")
    (tmp_path / "torchrun.log").write_text("no summary")
    assert _failed_rank(tmp_path, tmp_path / "torchrun.log", 2) == (0, "RuntimeError('Connection reset by peer')")


def test_hang_culprit_stale_heartbeat_then_fewest_lines(tmp_path):
    now = time.time()
    beats = {0: (now, 7), 1: (now - 30, 5), 2: (now, 7)}
    for r, (t, n) in beats.items():
        (tmp_path / f"rank{r}.heartbeat").write_text(json.dumps({"time": t, "lines": n}))
    r, how = _hang_culprit(tmp_path, 3)
    assert r == 1 and "stopped responding" in how
    (tmp_path / "rank1.heartbeat").write_text(json.dumps({"time": now, "lines": 5}))
    assert _hang_culprit(tmp_path, 3) == (1, "is behind the other ranks, which wait for it")
    assert _hang_culprit(tmp_path, 4)[1] == "never started"


def _cpu_ranks(timed: dict, check: bool) -> list[dict]:
    """Two pipeline ranks' results on CPU, with ``timed`` and (``check``) the SGD check's."""
    return [
        {
            "rank": r,
            "device": "cpu",
            "backend": "gloo",
            "coords": {"pp": r, "dp": 0, "tp": 0},
            "has_last_stage": r == 1,
            "rss_baseline_bytes": 2**28,
            "timed": timed,
            **({"check": {"losses": [6.0, 5.9] if r else [None, None], "grad_norms": [1.0, 0.9]}} if check else {}),
        }
        for r in range(2)
    ]


def test_summary_and_report():
    spec = RunSpec(model=load_model("tiny"), plan=Plan(p=2), global_batch=4)
    timed = {"step_time_s": 0.5, "peak_memory_bytes": 2**29 + 2**28, "losses": [6.0]}
    ranks = _cpu_ranks(timed, check=True)
    ref = {"losses": [6.0, 5.9 * (1 + 2e-4)], "grad_norms": [1.0, 0.9]}
    result = summarize(spec, ranks, ref, {"plan": {"p": 2}, "step_time_s": 0.4, "peak_memory_gib": 0.25})
    assert abs(result["error_pct"] - 25.0) < 1e-9 and abs(result["memory_error_pct"] - 100.0) < 1e-9
    assert result["loss_match"] is False and abs(result["max_rel_loss_diff"] - 2e-4) < 1e-6
    assert result["measured_peak_reserved_gib"] is None  # CPU ranks: no allocator figure
    cuda = [{**r, "device": "cuda", "timed": {**timed, "peak_reserved_bytes": (r["rank"] + 1) * 2**30}} for r in ranks]
    on_gpu = summarize(spec, cuda, ref, None)
    assert on_gpu["measured_peak_reserved_gib"] == 2.0  # the largest rank's
    assert "reserved up to 2.000 GiB" in format_report(on_gpu)
    text = format_report(result)
    assert "MISMATCH" in text and "+25.0%" in text
    assert compare([1.0, 2.0], [1.0, 2.0]) == 0.0


def test_host_speed_factor_and_the_prediction_at_it():
    """A host at 0.5x the profile's GEMM rate and 2x its eager layer time runs at sqrt(0.5 x 0.5)
    = 0.5x its speed: the 0.4 s prediction becomes 0.8 s, and 0.6 s measured is -25% from it."""
    speed = HostSpeed(gemm_tflops=0.05, profile_gemm_tflops=0.1, layer_us=2000.0, profile_layer_us=1000.0)
    assert speed.factor == 0.5
    assert HostSpeed(0.2, 0.1, 1000.0, 1000.0).factor == pytest.approx(2**0.5)  # twice the GEMM rate alone
    result = with_host_speed({"predicted_step_time_s": 0.4, "measured_step_time_s": 0.6}, speed)
    assert result["predicted_step_time_at_host_speed_s"] == pytest.approx(0.8)
    assert result["error_at_host_speed_pct"] == pytest.approx(-25.0)
    assert with_host_speed({"predicted_step_time_s": None}, speed) == {"predicted_step_time_s": None}
    assert with_host_speed({"predicted_step_time_s": 0.4}, None) == {"predicted_step_time_s": 0.4}
    # before and after the run: the mean rate and time, then their factor
    both = HostSpeed.mean([HostSpeed(0.1, 0.1, 1000.0, 1000.0), speed])
    assert (both.gemm_tflops, both.layer_us) == (pytest.approx(0.075), 1500.0)
    assert both.factor == pytest.approx((0.75 / 1.5) ** 0.5)


def test_report_shows_the_host_speed_line():
    spec = RunSpec(model=load_model("tiny"), plan=Plan(p=2), global_batch=4)
    ranks = _cpu_ranks({"step_time_s": 0.6, "peak_memory_bytes": 2**29, "losses": [6.0]}, check=False)
    result = summarize(spec, ranks, None, {"plan": {"p": 2}, "step_time_s": 0.4, "peak_memory_gib": 0.25})
    text = format_report(with_host_speed(result, HostSpeed(0.05, 0.1, 2000.0, 1000.0)))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("host now"))
    assert lines[at - 1].startswith("step time") and lines[at + 1].startswith("peak memory")
    assert "0.8000 s" in lines[at] and "-25.0%" in lines[at] and "0.50x its profile's speed" in lines[at]


def test_cpu_memory_is_the_anonymous_growth_where_linux_reports_it():
    """A rank whose anonymous memory peaked at 96 MiB over the timed steps and held 64 MiB before
    the model was built held 32 MiB for training, whatever its peak RSS (libtorch's code pages
    included); a rank without those fields falls back to the peak RSS over its RSS before."""
    spec = RunSpec(model=load_model("tiny"), plan=Plan(p=2), global_batch=4)
    timed = {"step_time_s": 0.5, "peak_memory_bytes": 2**28 + 40 * 2**20, "losses": [6.0]}
    anon = {**timed, "peak_anon_bytes": 96 * 2**20}
    ranks = [{**r, "anon_baseline_bytes": 64 * 2**20, "timed": anon} for r in _cpu_ranks(timed, check=False)]
    prediction = {"plan": {"p": 2}, "step_time_s": 0.5, "peak_memory_gib": 1 / 32}
    result = summarize(spec, ranks, None, prediction)
    assert result["measured_peak_memory_gib"] == 1 / 32 and result["memory_error_pct"] == 0.0
    assert result["measured_memory_is_anonymous"] is True
    assert "anonymous memory at its peak RSS" in format_report(result)
    ranks[1] = {**ranks[1], "anon_baseline_bytes": None}  # one rank without the figure: RSS for all
    rss = summarize(spec, ranks, None, prediction)
    assert rss["measured_memory_is_anonymous"] is False and rss["measured_peak_memory_gib"] == 40 / 1024
    assert "growth of the busiest rank's peak RSS over its RSS" in format_report(rss)
