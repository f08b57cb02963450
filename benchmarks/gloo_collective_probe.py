"""Gloo's reduce-scatter and all-gather beside in-place all-reduces: the time per call and what each
leaves in the ranks' anonymous memory (issue 36; why autoplan's program runs its data-parallel
reduce-scatters and all-gathers as all-reduces on gloo: simulator.runtime_spec.Runtime
``scatter_gather``, autoplan/runtime/gloo_comms.py, autoplan/runtime/zero1.py).

    python benchmarks/gloo_collective_probe.py [--ranks N] [--mib M] [--calls K]

Each way runs in a fresh group of ``--ranks`` gloo processes on this host (torch.multiprocessing,
one intra-op thread each) over an fp32 buffer of about ``--mib`` MiB (the tiny model's 3.3 MiB of
parameters by default), ``--calls`` times; rank 0 prints the growth of its anonymous memory
(``RssAnon`` of /proc/self/status) over the calls, at its largest, and the mean time per call:

* ``reduce_scatter_tensor`` / ``all_gather_into_tensor``: gloo's own;
* ``all-reduce as reduce-scatter``: the buffer all-reduced in place, this rank's chunk copied out;
* ``all-reduce as all-gather``: the other ranks' slots zeroed, the buffer all-reduced in place;
* a ZeRO-1 step's pair either way.

On this project's 2-core VM with 4 ranks (torch 2.13, 2026-11-30, four runs,
benchmarks/data/gloo-collective-probe-2026-11-30.txt has two): 27-53 and 13-23 MiB kept by gloo's
reduce-scatter and all-gather, 3-4 MiB by the all-reduces, a ZeRO-1 step's pair in 14-17 ms either
way. Not run in CI (about 20 s).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MiB = 2**20
# torch 2.13 renamed the flat collectives (the old names warn); older releases only have the old ones
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def anonymous_mib() -> float:
    """This process's anonymous resident memory, MiB (RssAnon of /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def ways(flat: torch.Tensor, shard: torch.Tensor, rank: int) -> dict[str, Callable[[], None]]:
    """One call of each way over ``flat`` (the whole buffer) and ``shard`` (this rank's part)."""
    n = shard.numel()
    own = flat[rank * n : (rank + 1) * n]

    def as_reduce_scatter() -> None:
        dist.all_reduce(flat)
        shard.copy_(own)

    def as_all_gather() -> None:
        flat[: rank * n].zero_()
        flat[(rank + 1) * n :].zero_()
        own.copy_(shard)
        dist.all_reduce(flat)

    return {
        "reduce_scatter_tensor": lambda: _reduce_scatter(shard, flat),
        "all_gather_into_tensor": lambda: _all_gather(flat, shard),
        "all-reduce as reduce-scatter": as_reduce_scatter,
        "all-reduce as all-gather": as_all_gather,
        "ZeRO-1 pair, gloo's own": lambda: (
            _reduce_scatter(shard, flat),
            _all_gather(flat, shard),
        ),
        "ZeRO-1 pair, all-reduces": lambda: (as_reduce_scatter(), as_all_gather()),
    }


def _rank(rank: int, ranks: int, init: str, way: str, numel: int, calls: int, out: mp.SimpleQueue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=ranks)
    try:
        flat = torch.randn(numel)
        shard = torch.empty(numel // ranks)
        call = ways(flat, shard, rank)[way]
        before = peak = anonymous_mib()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
            peak = max(peak, anonymous_mib())
        seconds = (time.perf_counter() - t0) / calls
        if rank == 0:
            out.put((peak - before, seconds))
    finally:
        dist.destroy_process_group()


def probe(way: str, ranks: int, numel: int, calls: int) -> tuple[float, float]:
    """(rank 0's anonymous-memory growth in MiB, mean seconds per call) of ``way``."""
    out = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _rank,
            args=(ranks, os.path.join(tmp, "init"), way, numel, calls, out),
            nprocs=ranks,
            start_method="spawn",
        )
    return out.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mib", type=float, default=3.3)
    ap.add_argument("--calls", type=int, default=60)
    a = ap.parse_args()
    numel = max(a.ranks, int(a.mib * MiB / 4) // a.ranks * a.ranks)
    print(f"{a.ranks} gloo ranks, fp32 buffer of {numel * 4 / MiB:.2f} MiB, {a.calls} calls, torch {torch.__version__}")
    print(f"{'way':30s} {'kept MiB':>9s} {'ms/call':>8s}")
    for way in ways(torch.zeros(a.ranks), torch.zeros(1), 0):
        kept, seconds = probe(way, a.ranks, numel, a.calls)
        print(f"{way:30s} {kept:9.1f} {seconds * 1e3:8.2f}")


if __name__ == "__main__":
    main()
