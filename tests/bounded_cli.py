"""Run the real CLI with a deadline that ends its worker processes too (a hang fails the test
instead of stalling the suite; subprocess.run's timeout kills only the parent, and a search's
forked workers would spin on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO


def run_bounded(*args: str, deadline_s: float) -> subprocess.CompletedProcess:
    """``python -m autoplan ARGS`` in its own session, killed with every process of it (the
    search's workers) when it has not answered after ``deadline_s`` seconds, which fails the
    calling test."""
    env = {k: v for k, v in os.environ.items() if k != "AUTOPLAN_DEBUG"}
    cmd = [sys.executable, "-m", "autoplan", *args]
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"autoplan {' '.join(args)}: no answer in {deadline_s:.0f} s")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
