"""The vocabulary split over tensor-parallel ranks (autoplan.runtime.vocab_parallel) equals the
whole-vocabulary embedding and cross entropy: values, gradients, and a gradient that stays split;
and the collectives of tensor and sequence parallelism (autoplan.runtime.tp_collectives) move and
sum what Megatron's mappings do, forward and backward (torchrun, gloo, 2 ranks;
tests/vocab_parallel_worker.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("vocab_parallel_worker.py")


@pytest.mark.timeout(180)
def test_split_vocabulary_matches_the_whole_one():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent.parent)}
