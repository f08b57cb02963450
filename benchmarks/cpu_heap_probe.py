"""What the CPU ranks' resident memory holds beyond the tensors the planner prices (issue 36): the
tiny model's plans run by ``autoplan run`` under glibc malloc settings that return freed blocks to
the system, beside the default.

    python benchmarks/cpu_heap_probe.py [--only TEXT] [--steps N]

Each setting is an environment variable glibc reads at a process's start (man mallopt):
``MALLOC_MMAP_THRESHOLD_=N`` serves every block of N bytes or more by mmap and unmaps it when
freed (fixed: without it glibc raises the threshold to the largest block freed so far, up to
32 MiB, and serves the blocks below it from its heap, which keeps them); ``MALLOC_ARENA_MAX=1``
puts every thread's blocks in one heap (gloo's worker threads otherwise get heaps of their own).
The measured memory is ``autoplan run``'s: the growth of the busiest rank's anonymous memory at
its resident peak over the same before the model was built (benchmarks/data/cpu-heap-probe-2026-11-29.txt
was measured before ``autoplan run`` left libtorch's code pages out: the growth of its peak RSS). A
low threshold shows the tensors' own peak (the prediction plus the small blocks below it); the
difference from the default is what the heap keeps. Not run in CI (about
10 s per run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_zero_matrix import Row, environment, fmt, measure, predict

PLANS = (
    "t=1,p=1,d=1,mb=2,zero=0",
    "t=1,p=1,d=2,mb=2,zero=2",
    "t=1,p=1,d=2,mb=2,zero=3",
    "t=1,p=1,d=4,mb=2,zero=3",
    "t=1,p=2,d=2,mb=2,zero=3",
)
SETTINGS: tuple[dict[str, str], ...] = (
    {},
    {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)},
    {"MALLOC_MMAP_THRESHOLD_": str(512 << 10)},
    {"MALLOC_MMAP_THRESHOLD_": str(64 << 10)},
    {"MALLOC_ARENA_MAX": "1"},
)


def run(text: str, setting: dict[str, str], run_dir: Path, steps: int | None) -> Row:
    """The plan ``text`` predicted and run with the environment ``setting`` added."""
    row = predict(text)
    if row.job is None:
        return row
    with environment(setting):
        measure(row, run_dir, steps)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], help="run only the plans containing this text")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (default: about 3 s)")
    a = ap.parse_args(argv)
    plans = [p for p in PLANS if not a.only or any(o in p for o in a.only)]
    print(f"{'plan':<26} {'setting':<32} {'meas s':>8} {'pred s':>8} {'meas MiB':>9} {'pred MiB':>9} {'over MiB':>9}")
    with tempfile.TemporaryDirectory(prefix="autoplan-heap-probe-") as tmp:
        for i, text in enumerate(plans):
            for j, setting in enumerate(SETTINGS):
                row = run(text, setting, Path(tmp) / f"run{i}-{j}", a.steps)
                name = " ".join(f"{k}={v}" for k, v in setting.items()) or "default"
                over = (
                    None
                    if row.measured_mib is None or row.predicted_mib is None
                    else row.measured_mib - row.predicted_mib
                )
                print(
                    f"{text:<26} {name:<32} {fmt(row.measured_s, '8.4f')} {fmt(row.predicted_s, '8.4f')} "
                    f"{fmt(row.measured_mib, '9.1f')} {fmt(row.predicted_mib, '9.1f')} {fmt(over, '+9.1f')} {row.note}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
