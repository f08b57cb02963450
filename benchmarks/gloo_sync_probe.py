"""A gloo all-reduce issued right after a burst of compute, against the same all-reduces back to
back, by message size (issue 36: what a CPU rank's collectives cost inside training).

    torchrun --standalone --nproc-per-node 2 benchmarks/gloo_sync_probe.py [--gemms K] [--rounds R]

Every rank runs, in interleaved rounds so that the host's drift moves all alike: ``--calls``
all-reduces back to back; ``--calls`` times a burst of ``--gemms`` fp32 GEMMs (256x512 by
512x256) followed by one all-reduce; and the bursts alone. Rank 0 prints per size the median
back-to-back call (and the fastest loop's, what ``autoplan calibrate`` fits its collectives to:
hwprofiles/calibrate/comm.py, best of the timed loops), and the call after a burst (the
loop's time less the bursts'), with its excess over both.

What the simulator prices for such a call is the node's fit of the back-to-back calls plus
``sync_wait_us`` once, which calibrate measures with a scalar all-reduce, and ``sync_bus_us_per_MB``
on each bus byte, which it measures with a 1 MiB all-reduce against the fastest back-to-back loop
(simulator.cost.collectives.sync_link, hwprofiles/calibrate/wait.py). On
this project's 2-core AMD EPYC VM (torch 2.13, 2026-11-30, three runs in
benchmarks/data/amd-epyc-2026-11-30/gloo-sync-probe.txt) a 0.79 MB call (a tiny-model layer's
parameters, FSDP2's gather on gloo) took 2.6-3.1 ms after a 3.7 ms burst and 1.7 ms after a
1.3 ms one, against 0.7-1.2 ms in the fastest back-to-back loop and 1.9-2.4 ms at the median;
a scalar's excess was 0.04-0.37 ms. Not run in CI (about 20 s).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

#: fp32 elements of the messages: a scalar, 64 KiB (the tiny model's tensor-parallel activations at
#: mb=2), 0.79 MB (one of its layers' parameters) and 3.1 MB (all of them)
SIZES = (1, 16_384, 197_000, 786_432)


def _seconds_per_call(fn: Callable[[], object], calls: int) -> float:
    """The mean time per call of ``fn`` over ``calls`` calls, the ranks started together."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gemms", type=int, default=6, help="GEMMs per burst (about 0.6 ms each here)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (the medians are over these)")
    ap.add_argument("--calls", type=int, default=10, help="calls per timed loop")
    a = ap.parse_args()
    torch.set_num_threads(1)  # one core per rank, as autoplan run's CPU ranks
    dist.init_process_group("gloo")
    x, y = torch.randn(256, 512), torch.randn(512, 256)

    def burst() -> None:
        for _ in range(a.gemms):
            x @ y

    buffers = {n: torch.randn(n) for n in SIZES}
    back: dict[int, list[float]] = {n: [] for n in SIZES}
    after: dict[int, list[float]] = {n: [] for n in SIZES}
    alone: list[float] = []
    for _ in range(a.rounds):
        for n, buf in buffers.items():
            back[n].append(_seconds_per_call(lambda b=buf: dist.all_reduce(b), a.calls))
            after[n].append(_seconds_per_call(lambda b=buf: (burst(), dist.all_reduce(b)), a.calls))
        alone.append(_seconds_per_call(burst, a.calls))
    if dist.get_rank() == 0:
        us = 1e6
        bursts = statistics.median(alone)
        print(
            f"{dist.get_world_size()} gloo ranks, torch {torch.__version__}, bursts of {a.gemms} GEMMs: {bursts * us:.0f} us"
        )
        print(
            f"{'MB':>8} {'back-to-back us':>16} {'fastest loop':>13} {'after a burst':>14} {'excess':>8} {'over fastest':>13}"
        )
        for n in SIZES:
            mid, best = statistics.median(back[n]), min(back[n])
            call = statistics.median(after[n]) - bursts
            print(
                f"{n * 4 / 1e6:8.3f} {mid * us:16.0f} {best * us:13.0f} {call * us:14.0f} {(call - mid) * us:+8.0f} {(call - best) * us:+13.0f}"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
