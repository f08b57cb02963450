"""``autoplan run`` says what it observed when a run outlasts --timeout: a run still logging new
steps is slow (a longer --timeout or fewer --steps), not hung; a silent one is hung, with the
rank named. Earlier runs' results are kept."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from test_verify_run import CLI, emit_data_parallel_run_dir

from autoplan.launch import ProgressWatch, results_dir, timeout_message


def _beat(out, lines: dict[int, int], age_s: float = 0.0) -> None:
    for r, n in lines.items():
        (out / f"rank{r}.heartbeat").write_text(json.dumps({"time": time.time() - age_s, "lines": n}))
        (out / f"rank{r}.log").write_text("".join(f"[rank {r}] 00:00:00 timed step {i}/9\n" for i in range(n)))


def test_a_run_still_logging_is_reported_slow_not_hung(tmp_path):
    watch = ProgressWatch(tmp_path, 2)
    _beat(tmp_path, {0: 3, 1: 3})
    watch.poll()
    _beat(tmp_path, {0: 5, 1: 5})
    watch.poll()
    message = timeout_message(60, watch, tmp_path, 2)
    assert "still making progress" in message and "hung" not in message
    assert "--timeout" in message and "timed step 4/9" in message


def test_a_silent_run_is_reported_hung_with_the_rank_behind(tmp_path):
    watch = ProgressWatch(tmp_path, 2)
    _beat(tmp_path, {0: 5, 1: 3})
    watch.poll()
    watch.last_change -= 120  # nothing new logged for two minutes
    message = timeout_message(60, watch, tmp_path, 2)
    assert "hung" in message and "still making progress" not in message
    assert "rank 1 is behind the other ranks" in message


def test_quiet_is_judged_against_this_runs_own_step_gaps(tmp_path):
    """A run whose steps take a minute each is not hung after 30 quiet seconds."""
    watch = ProgressWatch(tmp_path, 1)
    _beat(tmp_path, {0: 1})
    watch.poll()
    watch.last_change -= 60
    _beat(tmp_path, {0: 2})
    watch.poll()  # a 60 s gap between two lines
    watch.last_change -= 30
    assert watch.progressing()
    watch.last_change -= 100
    assert not watch.progressing()


def test_each_run_gets_its_own_results_folder(tmp_path):
    first, second = results_dir(tmp_path), results_dir(tmp_path)
    assert first != second and first.is_dir() and second.is_dir()
    assert first.parent == second.parent == tmp_path / "results"


@pytest.mark.timeout(240)
def test_a_healthy_run_past_its_timeout_is_called_slow(tmp_path):
    """Through the CLI: 100,000 steps of the tiny model under a 30 s --timeout (its two ranks
    start logging within about 8 s on a 2-core host, 16 s at half its speed); a first run's
    results folder is still there after the second."""
    run_dir = emit_data_parallel_run_dir(tmp_path)
    (run_dir / "results" / "run-earlier").mkdir(parents=True)
    (run_dir / "results" / "run-earlier" / "rank0.json").write_text("{}")
    proc = subprocess.run(
        [*CLI, "run", str(run_dir), "--steps", "100000", "--timeout", "30"],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert "still making progress" in line and "hung" not in line, line
    assert (run_dir / "results" / "run-earlier" / "rank0.json").is_file()
    assert len(list(run_dir.glob("results/run-*/rank0.log"))) == 1
