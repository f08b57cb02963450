"""Collective bandwidth and latency for ``autoplan calibrate``: N ranks on this host.

Spawns ``ranks`` processes (torch.multiprocessing, start method spawn) joined by
torch.distributed (gloo on CPU with one intra-op thread per rank, as the CPU verification
runs use OMP_NUM_THREADS=1; nccl on CUDA, one GPU per rank). All-reduce, all-gather and
reduce-scatter are timed over every group size of ``group_sizes(ranks)``: all ranks, and,
with 4 or more (an even number), also pairs (0,1), (2,3), ... all running at once, as the
tensor- or data-parallel pairs of a 4-rank plan do. Send/recv is a ping-pong (half the round
trip) between ranks 0 and 1, or between all pairs at once when there are 4 or more.
Then, on CPU, the ranks measure the host's compute slots, and they time the tensor-parallel
reference layer's host work against the plain layer's (both: ``calibrate.ranks``).
Last, on CPU with 3 or more ranks, how long a message waits for a core while the other ranks
compute (``calibrate.wait``).
Each measurement: n back-to-back calls between barriers, the slowest rank's mean per call,
best of the timed loops (``calibrate.timing.Timing``), at every message size (as in
``calibrate.fit.CollectiveSample``; fp32 payloads). ``calibrate.fit.fit_link`` then fits the
samples into the node's intra-node link. Rank 0 reports each sample (and progress) to the
parent through a queue.
"""

from __future__ import annotations

import math
import os
import queue as queue_mod
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hwprofiles.calibrate.eager import TpRatios
from hwprofiles.calibrate.fit import COLLECTIVES, CollectiveSample
from hwprofiles.calibrate.host import resident_GiB
from hwprofiles.calibrate.ranks import compute_slots, tp_ratios
from hwprofiles.calibrate.reference_layers import LayerSplit
from hwprofiles.calibrate.settings import Timing
from hwprofiles.calibrate.wait import busy_wait_s, sync_wait_s

_MAX_CALLS = 10_000
_JOIN_POLL_S = 0.2
_DONE_WAIT_S = 30.0


@dataclass(frozen=True)
class CommResult:
    backend: str
    ranks: int
    samples: list[CollectiveSample]
    rank_resident_GiB: float  # RSS of rank 0 after init_process_group and the benchmarks
    tp_ratios: TpRatios  # the tensor-parallel reference layer's host time over the plain one's (mean over ranks)
    compute_slots: dict[int, float] | None  # CPU: busy ranks -> aggregate / solo throughput (None on CUDA)
    busy_wait_s: float | None = None  # CPU, 3+ ranks: extra message latency while the other ranks compute
    sync_wait_s: dict[int, float] | None = None  # CPU: busy ranks -> extra time of a collective after computing
    sync_bus_s_per_byte: dict[int, float] | None = None  # CPU: busy ranks -> extra time per bus byte of one


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp, group=group)


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp, group=group)


def group_sizes(ranks: int) -> tuple[int, ...]:
    """Group sizes the collectives are timed over (module docstring)."""
    return (ranks, 2) if ranks >= 4 and ranks % 2 == 0 else (ranks,)


def _pair_groups(world: int) -> list[Any]:
    """Groups (0,1), (2,3), ...; every rank creates all of them, in order (torch.distributed rule)."""
    return [dist.new_group([r, r + 1]) for r in range(0, world - 1, 2)]


def _collective(
    op: str, nbytes: int, rank: int, world: int, size: int, group: Any, device: torch.device
) -> tuple[Callable[[], object], int]:
    """(one call, messages per call) of ``op`` over ``group`` (``size`` ranks; None: all ranks)
    moving ``nbytes`` (rounded to whole fp32 shards); send/recv pairs rank r with r xor 1."""
    n = max(size, nbytes // 4 // size * size)
    full = torch.ones(n, device=device)
    shard = torch.ones(n // size, device=device)
    if op == "all_reduce":
        return (lambda: dist.all_reduce(full, group=group)), 1
    if op == "all_gather":
        return (lambda: _all_gather(full, shard, group)), 1
    if op == "reduce_scatter":
        return (lambda: _reduce_scatter(shard, full, group)), 1
    if op == "send_recv":
        peer = rank ^ 1
        if peer >= world:
            return (lambda: None), 2
        if rank % 2 == 0:
            return (lambda: (dist.send(full, peer), dist.recv(full, peer))), 2
        return (lambda: (dist.recv(full, peer), dist.send(full, peer))), 2
    raise ValueError(f"unknown collective {op!r}")


def _slowest(x: float, device: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _time_collective(fn: Callable[[], object], device: torch.device, timing: Timing) -> float:
    """Best over the timed loops of the slowest rank's mean time per call (seconds). Every rank
    sees the same (all-reduced) samples, so all decide alike when they are enough."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    fn()
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    sync()
    first = _slowest(time.perf_counter() - t0, device)
    n = int(min(_MAX_CALLS, max(1, math.ceil(timing.min_time_s / max(first, 1e-9)))))
    samples: list[float] = []
    while not timing.enough(samples, n):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        samples.append(_slowest((time.perf_counter() - t0) / n, device))
    return min(samples)


def _schedule(world: int) -> list[tuple[str, int]]:
    """(collective, group size) pairs to time: each collective over each group size, send/recv once."""
    return [(op, size) for op in COLLECTIVES for size in (group_sizes(world) if op != "send_recv" else (2,))]


def comm_items(ranks: int, n_sizes: int) -> int:
    """Progress-bar items of ``measure_collectives`` (the last one: the TP layer)."""
    return len(_schedule(ranks)) * n_sizes + 1


def _worker(
    rank: int,
    world: int,
    device_type: str,
    init_file: str,
    sizes: tuple[int, ...],
    timing: Timing,
    eager_repeats: int,
    split_layer: LayerSplit,
    out: Any,
) -> None:
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
        pairs = _pair_groups(world) if world > 2 and 2 in group_sizes(world) else []
        for op, size in _schedule(world):
            group = pairs[rank // 2] if size < world and op != "send_recv" else None
            for nbytes in sizes:
                fn, msgs = _collective(op, nbytes, rank, world, size, group, device)
                t = _time_collective(fn, device, timing) / msgs
                if rank == 0:
                    out.put(("sample", op, nbytes, size, t))
        slots = compute_slots(rank, device, 0.05 * eager_repeats) if device.type == "cpu" else None
        tp = tp_ratios(world, device, eager_repeats, split_layer)
        wait = busy_wait_s(rank, world) if device.type == "cpu" else None
        sync = sync_wait_s(rank, world) if device.type == "cpu" else (None, None)
        dist.barrier()
        if rank == 0:
            out.put(("done", resident_GiB(), tp.forward, tp.backward, tp.optimizer, slots, wait, *sync))
    finally:
        dist.destroy_process_group()


def _handle(msg: tuple, samples: list[CollectiveSample], tick: Callable[[str], None]) -> tuple | None:
    """Record one message from rank 0; on the final one returns (rank 0's RSS, the TP layer's
    host time ratios, the compute slots, the busy wait, the sync waits, the bus waits)."""
    if msg[0] == "sample":
        _, op, nbytes, size, t = msg
        samples.append(CollectiveSample(op=op, nbytes=int(nbytes), ranks=int(size), seconds=float(t)))
        tick(f"{op} {nbytes} B x{size}")
        return None
    tick("tensor-parallel layer host time")
    return float(msg[1]), TpRatios(float(msg[2]), float(msg[3]), float(msg[4])), msg[5], msg[6], msg[7], msg[8]


def measure_collectives(
    device: str,
    ranks: int,
    sizes: tuple[int, ...],
    timing: Timing,
    eager_repeats: int,
    split_layer: LayerSplit,
    tick: Callable[[str], None],
) -> CommResult:
    """Spawn ``ranks`` processes and time the collectives, and the layer ``split_layer`` splits
    over 2 of them (module docstring); ``split_layer`` must be picklable (a module's function)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    samples: list[CollectiveSample] = []
    final: tuple | None = None
    with tempfile.TemporaryDirectory(prefix="autoplan-calibrate-") as tmp:
        procs = mp.start_processes(
            _worker,
            args=(ranks, device, os.path.join(tmp, "store"), sizes, timing, eager_repeats, split_layer, out),
            nprocs=ranks,
            join=False,
            start_method="spawn",
        )
        try:
            finished = False
            while not finished:
                finished = procs.join(timeout=_JOIN_POLL_S)
                while True:
                    try:
                        msg = out.get_nowait()
                    except queue_mod.Empty:
                        break
                    final = _handle(msg, samples, tick) or final
            deadline = time.monotonic() + _DONE_WAIT_S
            while final is None and time.monotonic() < deadline:
                try:
                    final = _handle(out.get(timeout=1.0), samples, tick) or final
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
    if final is None:
        raise RuntimeError("collective benchmark: rank 0 did not report its results")
    # rank 0's figures (_handle), in CommResult's order: RSS, TP ratios, slots, busy wait, sync and bus waits
    return CommResult("nccl" if device == "cuda" else "gloo", ranks, samples, *final)
