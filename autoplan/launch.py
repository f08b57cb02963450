"""``autoplan run``'s launch: an emitted run dir's ``launch.sh`` under torchrun on this machine,
watched until it ends (docs/design.md section 6).

Each run writes into a new ``results/run-<date>-<time>/`` folder of the run dir (earlier runs'
results are kept). A crashed worker ends the run with a :class:`RunError` naming the rank and
its last log lines; a run that outlasts ``--timeout`` is reported as what was observed: still
logging new lines (slow: a longer --timeout or fewer --steps), or silent (hung: the rank that
stopped responding, or the one the others wait for). No worker is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from autoplan.runtime.config import PLAN_FILE, RunSpec
from hwprofiles.errors import InputError, RunError

WARMUP_STEPS = 2


def _tail(path: Path, n: int = 3) -> list[str]:
    try:
        lines = [line.rstrip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return []
    return lines[-n:]


def _worker_pids(out: Path) -> dict[int, int]:
    """rank -> pid, from the 'pid N start' line each worker logs first."""
    pids = {}
    for log in out.glob("rank*.log"):
        m = re.search(r"\[rank (\d+)\] \S+ pid (\d+) start", log.read_text(errors="replace"))
        if m:
            pids[int(m.group(1))] = int(m.group(2))
    return pids


def _is_our_worker(pid: int) -> bool:
    try:
        return b"autoplan.runtime.train" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _kill_leftovers(out: Path) -> None:
    """SIGKILL any worker of this run still alive (by the pids the workers logged)."""
    for pid in _worker_pids(out).values():
        if _is_our_worker(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stop(proc: subprocess.Popen, out: Path) -> None:
    """Stop torchrun (its own session) and then every worker it may have left."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    _kill_leftovers(out)


def last_lines(out: Path, rank: int, n: int = 3) -> str:
    """The rank's last log lines (its own '[rank r]' lines, not traceback frames)."""
    lines = [line for line in _tail(out / f"rank{rank}.log", 10_000) if line.startswith("[rank")]
    return " | ".join(lines[-n:]) if lines else "(no log lines)"


def _failure_reason(out: Path, rank: int) -> str | None:
    p = out / f"rank{rank}.log"
    m = re.search(r"FAILED: (.*)", p.read_text(errors="replace")) if p.exists() else None
    return m.group(1)[:300] if m else None


def _failed_rank(out: Path, torchrun_log: Path, world: int) -> tuple[int | None, str]:
    """The rank that failed first (torchrun's root cause, else a worker that logged FAILED) and how."""
    text = torchrun_log.read_text(errors="replace") if torchrun_log.exists() else ""
    m = (
        re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text.split("Root Cause", 1)[1], re.S)
        if "Root Cause" in text
        else None
    )
    if m:
        rank, code = int(m.group(1)), int(m.group(2))
        how = _failure_reason(out, rank) or f"exit code {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-code).name}"
        return rank, how
    for r in range(world):
        reason = _failure_reason(out, r)
        if reason:
            return r, reason
    return None, "unknown failure"


def _hang_culprit(out: Path, world: int, stale_s: float = 5.0) -> tuple[int, str]:
    """On a hang: a rank whose heartbeat stopped (stopped or stuck outside Python), else the
    rank that logged least (the others wait for it in a collective)."""
    now = time.time()
    beats: dict[int, dict[str, float]] = {}
    for r in range(world):
        try:
            beats[r] = json.loads((out / f"rank{r}.heartbeat").read_text())
        except (OSError, ValueError):
            return r, "never started"
    stale = [r for r in range(world) if now - beats[r]["time"] > stale_s]
    if stale:
        r = max(stale, key=lambda r: now - beats[r]["time"])
        return r, f"stopped responding (no heartbeat for {now - beats[r]['time']:.0f} s)"
    r = min(range(world), key=lambda r: (beats[r]["lines"], r))
    if all(b["lines"] == beats[r]["lines"] for b in beats.values()):
        return r, "logged nothing new, like every other rank: all wait at the same point"
    return r, "is behind the other ranks, which wait for it"


class ProgressWatch:
    """What the ranks' heartbeats say about progress while the run goes on: when the ranks last
    logged a new line, and the longest quiet spell between two new lines so far (one step or
    phase of this run). Polled about once a second by :func:`launch`."""

    def __init__(self, out: Path, world: int):
        self.out, self.world = out, world
        self.lines_by_rank: dict[int, int] = {}  # the last count each rank's heartbeat gave
        self.lines = -1  # their sum at the last poll (-1: not polled yet)
        self.last_change = time.monotonic()
        self.longest_gap = 0.0

    def poll(self) -> None:
        for r in range(self.world):
            try:
                self.lines_by_rank[r] = int(json.loads((self.out / f"rank{r}.heartbeat").read_text())["lines"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
        total = sum(self.lines_by_rank.values())
        now = time.monotonic()
        if total != self.lines:
            if self.lines >= 0:
                self.longest_gap = max(self.longest_gap, now - self.last_change)
            self.lines, self.last_change = total, now

    def quiet_s(self) -> float:
        """Seconds since a rank last logged a new line."""
        return time.monotonic() - self.last_change

    def busiest_rank(self) -> int:
        """The rank that has logged most (rank 0 before any heartbeat)."""
        return max(self.lines_by_rank, key=lambda r: (self.lines_by_rank[r], -r), default=0)

    def progressing(self, min_quiet_s: float = 10.0) -> bool:
        """Still making progress: the ranks logged a new line more recently than twice the
        longest gap seen so far (a quiet spell under ``min_quiet_s`` never counts as a hang)."""
        return self.lines > 0 and self.quiet_s() <= max(min_quiet_s, 2 * self.longest_gap)


def timeout_message(timeout_s: float, watch: ProgressWatch, out: Path, world: int) -> str:
    """What was observed when the run outlasted ``--timeout``: a run still logging new steps was
    slow, not hung; otherwise the rank that stopped or that the others wait for."""
    if watch.progressing():
        r = watch.busiest_rank()
        return (
            f"run did not finish within --timeout {timeout_s:.0f} s but was still making progress "
            f"(a rank logged {watch.quiet_s():.0f} s before the timeout); give it a longer --timeout or fewer --steps; "
            f"rank {r}'s last log lines: {last_lines(out, r)}"
        )
    r, how = _hang_culprit(out, world)
    return (
        f"run timed out after {timeout_s:.0f} s: a worker hung (no rank logged anything for "
        f"{watch.quiet_s():.0f} s): rank {r} {how}; its last log lines: {last_lines(out, r)}"
    )


def results_dir(run_dir: Path) -> Path:
    """A new ``results/run-<date>-<time>`` folder for this run (earlier runs' folders are kept)."""
    base = run_dir / "results" / time.strftime("run-%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    try:
        out.mkdir(parents=True)
    except OSError as e:
        raise InputError(f"{run_dir}: cannot create {out}: {e.strerror}") from None
    return out


def _wait(proc: subprocess.Popen, out: Path, world: int, timeout_s: float) -> int:
    """torchrun's exit code; RunError saying what was observed when ``timeout_s`` passes first
    (the message is taken while the workers still run)."""
    watch = ProgressWatch(out, world)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return proc.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            watch.poll()
            if time.monotonic() >= deadline:  # the caller stops torchrun and the workers
                raise RunError(timeout_message(timeout_s, watch, out, world)) from None


def launch(
    run_dir: Path, spec: RunSpec, steps: int, check_steps: int, timeout_s: float, log: Callable[[str], None]
) -> Path:
    """Run ``launch.sh`` on this machine; return the results dir. Raises RunError on failure."""
    script = run_dir / "launch.sh"
    if not script.is_file():
        if (run_dir / PLAN_FILE).is_file():
            raise InputError(
                f"{script}: no such file: {run_dir} was emitted without --target torch (autoplan's program)"
            )
        raise InputError(f"{script}: no such file (is {run_dir} a directory written by 'autoplan emit'?)")
    out = results_dir(run_dir)
    torchrun_log = out / "torchrun.log"
    world = spec.world_size
    env = dict(
        os.environ,
        NNODES="1",
        NODE_RANK="0",
        NPROC_PER_NODE=str(world),
        PYTHON=sys.executable,
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )
    cmd = [
        "bash",
        str(script.absolute()),  # a run dir named "-x" is not an option of bash's
        "--steps",
        str(steps),
        "--warmup",
        str(WARMUP_STEPS if steps else 0),
        "--check-steps",
        str(check_steps),
        "--out",
        str(out),
        "--pg-timeout",
        str(timeout_s + 60),
    ]
    log(f"autoplan run: {world} processes, plan {spec.plan.to_string()}, logs in {out}")
    start = time.monotonic()
    with open(torchrun_log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = _wait(proc, out, world, timeout_s)
        except BaseException:
            _stop(proc, out)
            raise
    _kill_leftovers(out)
    if rc != 0:
        failed, how = _failed_rank(out, torchrun_log, world)
        if failed is None:
            raise RunError(f"torchrun exited with code {rc}; last lines: {' | '.join(_tail(torchrun_log))}")
        raise RunError(f"worker rank {failed} failed ({how}); its last log lines: {last_lines(out, failed)}")
    log(f"autoplan run: workers finished in {time.monotonic() - start:.1f} s")
    return out
