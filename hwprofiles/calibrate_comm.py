"""Collective bandwidth and latency for ``autoplan calibrate``: N ranks on this host.

Spawns ``ranks`` processes (torch.multiprocessing, start method spawn) joined by
torch.distributed (gloo on CPU with one intra-op thread per rank, as the CPU verification
runs use OMP_NUM_THREADS=1; nccl on CUDA, one GPU per rank). Each of all-reduce, all-gather,
reduce-scatter (over all ranks) and send/recv (a ping-pong between ranks 0 and 1, half the
round trip) is timed at every message size: n back-to-back calls between barriers, the
slowest rank's mean per call, median over ``repeats`` such loops. Message sizes are as in
``calibrate_fit.CollectiveSample``; payloads are fp32. The samples are then fitted with
``calibrate_fit.fit_link`` (ring alpha-beta model) into the node's intra-node link.
Rank 0 reports each sample (and progress) to the parent through a queue.
"""

from __future__ import annotations

import math
import os
import queue as queue_mod
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hwprofiles.calibrate_fit import COLLECTIVES, CollectiveSample
from hwprofiles.calibrate_host import resident_GiB

_MAX_CALLS = 10_000
_JOIN_POLL_S = 0.2
_DONE_WAIT_S = 30.0


@dataclass(frozen=True)
class CommResult:
    backend: str
    ranks: int
    samples: list[CollectiveSample]
    rank_resident_GiB: float  # RSS of rank 0 after init_process_group and the benchmarks


def _all_gather(out: torch.Tensor, inp: torch.Tensor) -> None:
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp)


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor) -> None:
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp)


def _collective(op: str, nbytes: int, rank: int, world: int, device: torch.device) -> tuple[Callable[[], None], int]:
    """(one call, messages per call) of collective ``op`` moving ``nbytes`` (rounded to whole fp32 shards)."""
    n = max(world, nbytes // 4 // world * world)
    full = torch.ones(n, device=device)
    shard = torch.ones(n // world, device=device)
    if op == "all_reduce":
        return (lambda: dist.all_reduce(full)), 1
    if op == "all_gather":
        return (lambda: _all_gather(full, shard)), 1
    if op == "reduce_scatter":
        return (lambda: _reduce_scatter(shard, full)), 1
    if op == "send_recv":
        if rank == 0:
            return (lambda: (dist.send(full, 1), dist.recv(full, 1))), 2
        if rank == 1:
            return (lambda: (dist.recv(full, 0), dist.send(full, 0))), 2
        return (lambda: None), 2
    raise ValueError(f"unknown collective {op!r}")


def _slowest(x: float, device: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _time_collective(fn: Callable[[], None], device: torch.device, min_time_s: float, repeats: int) -> float:
    """Median over ``repeats`` loops of the slowest rank's mean time per call (seconds)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    fn()
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    sync()
    first = _slowest(time.perf_counter() - t0, device)
    n = int(min(_MAX_CALLS, max(1, math.ceil(min_time_s / max(first, 1e-9)))))
    samples = []
    for _ in range(repeats):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        samples.append(_slowest((time.perf_counter() - t0) / n, device))
    return statistics.median(samples)


def _worker(rank: int, world: int, device_type: str, init_file: str, sizes: tuple[int, ...],
            min_time_s: float, repeats: int, out: Any) -> None:
    """One rank: join the group, time every (collective, size), rank 0 reports to ``out``."""
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for op in COLLECTIVES:
            for nbytes in sizes:
                fn, msgs = _collective(op, nbytes, rank, world, device)
                t = _time_collective(fn, device, min_time_s, repeats) / msgs
                if rank == 0:
                    out.put(("sample", op, nbytes, t))
        dist.barrier()
        if rank == 0:
            out.put(("done", resident_GiB()))
    finally:
        dist.destroy_process_group()


def _handle(msg: tuple, ranks: int, samples: list[CollectiveSample], tick: Callable[[str], None]) -> float | None:
    """Record one message from rank 0; returns rank 0's RSS on the final message."""
    if msg[0] == "sample":
        _, op, nbytes, t = msg
        samples.append(CollectiveSample(op=op, nbytes=int(nbytes), ranks=ranks, seconds=float(t)))
        tick(f"{op} {nbytes} B x{ranks}")
        return None
    return float(msg[1])


def measure_collectives(device: str, ranks: int, sizes: tuple[int, ...], min_time_s: float, repeats: int,
                        tick: Callable[[str], None]) -> CommResult:
    """Spawn ``ranks`` processes and time the collectives (module docstring)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    samples: list[CollectiveSample] = []
    rss: float | None = None
    with tempfile.TemporaryDirectory(prefix="autoplan-calibrate-") as tmp:
        procs = mp.start_processes(
            _worker, args=(ranks, device, os.path.join(tmp, "store"), sizes, min_time_s, repeats, out),
            nprocs=ranks, join=False, start_method="spawn")
        try:
            finished = False
            while not finished:
                finished = procs.join(timeout=_JOIN_POLL_S)
                while True:
                    try:
                        msg = out.get_nowait()
                    except queue_mod.Empty:
                        break
                    rss = _handle(msg, ranks, samples, tick) or rss
            deadline = time.monotonic() + _DONE_WAIT_S
            while rss is None and time.monotonic() < deadline:
                try:
                    rss = _handle(out.get(timeout=1.0), ranks, samples, tick) or rss
                except queue_mod.Empty:
                    continue
        except mp.ProcessRaisedException as e:
            raise RuntimeError(f"collective benchmark failed in a rank: {str(e).strip().splitlines()[-1]}") from e
        except mp.ProcessExitedException as e:
            raise RuntimeError(f"collective benchmark: a rank exited early ({e})") from e
        finally:
            for p in procs.processes:
                if p.is_alive():
                    p.terminate()
                p.join()
    if rss is None:
        raise RuntimeError("collective benchmark: rank 0 did not report its results")
    return CommResult(backend="nccl" if device == "cuda" else "gloo", ranks=ranks, samples=samples,
                      rank_resident_GiB=rss)
