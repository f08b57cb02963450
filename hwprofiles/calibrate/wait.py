"""How long a message waits for a busy core, for ``autoplan calibrate`` on CPU (``busy_latency_us``).

CPU ranks that outnumber the cores are time-sliced. A rank blocked on a message sleeps; when
the message arrives it is woken, and if the other ranks keep every core busy it waits for one
before it runs. Inside a training step that happens at every tensor-parallel all-reduce and
every pipeline send, while the other ranks compute; the collective benchmark never sees it,
because there every rank communicates. Measured: ranks 0 and 1 ping-pong a 16 KiB message
(half the round trip per message) while the other ranks sit at a barrier, then while they
run training steps of the reference GPT layer
(``calibrate.reference_layers.layer_training_step``, as the compute-slots loop), each for 8 times
the idle ping-pong's duration, so that they stay busy to its end. The extra one-way
latency is the median over rounds of busy minus idle (on this 2-core host: ~120 us idle,
~370-670 us with the two other ranks computing).

Sync wait (``sync_wait_us``): ranks that each have a core still lose time at every blocking
collective they issue between computations, which the back-to-back collective benchmark
never sees. The ranks arrive apart (a shared host's cores jitter: on this project's 2-core
VM two ranks finishing the same 1.7 ms of GEMMs at once land 0.2-0.7 ms apart on average,
with a tail of several ms), and the rank that arrived first sleeps in the collective and is
woken (~0.1 ms one way here, ~0.3 ms after 20 ms asleep; 2026-11-29). Measured: for every
number of busy ranks from 2 up to the cores (more ranks than cores are time-sliced, which
compute_slots and the busy latency above price), the busy ranks alternate a burst of
single-threaded GEMMs (:data:`BURST_GEMMS`, about the compute between a small model's
tensor-parallel all-reduces) and a scalar all-reduce among them; the wait is the mean time
inside those all-reduces, over calls and ranks, less that of the same all-reduces back to
back; the median over rounds.

Bus wait (``sync_bus_us_per_MB``): a large collective after computing loses more than the
scalar's wait. On this project's 2-core AMD EPYC VM a 0.79 MB gloo all-reduce took 1.7 ms after
1.3 ms of GEMMs and 2.6-3.5 ms after 3.7 ms, where the fastest back-to-back loop, which the
node's fit prices, took 0.7-1.2 ms (benchmarks/gloo_sync_probe.py, 2026-11-30). Measured in the
same rounds: the busy ranks alternate the same bursts and an all-reduce of :data:`BUS_BYTES`;
its mean time inside less the fastest of :data:`BUS_LOOPS` back-to-back loops of it, less the
scalar's wait, per bus byte (2(n-1)/n times the buffer over n ranks); the median over rounds.
Call every function here on every rank.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from hwprofiles.calibrate.host import cpu_cores
from hwprofiles.calibrate.reference_layers import layer_training_step
from hwprofiles.calibrate.settings import BURST_GEMMS, BUS_BYTES, BUS_LOOPS, SYNC_CALLS, WAIT_ROUNDS

MESSAGE_BYTES = 16384
PINGS = 200
BUSY_FACTOR = 8.0  # the busy ranks compute this many idle ping-pong durations


def _ping_pong(rank: int, x: torch.Tensor) -> float:
    """Seconds per one-way message of PINGS round trips between ranks 0 and 1."""
    t0 = time.perf_counter()
    for _ in range(PINGS):
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
    return (time.perf_counter() - t0) / (2 * PINGS)


def _compute_for(seconds: float) -> None:
    """Single-threaded training steps of the reference layer for ``seconds``."""
    step = layer_training_step()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        step()


def busy_wait_s(rank: int, world: int, rounds: int = WAIT_ROUNDS) -> float | None:
    """Extra one-way message latency while the other ranks compute (module docstring), as
    rank 0 measured it; None with fewer than 3 ranks (no rank left to keep the cores busy)."""
    if world < 3:
        return None
    x = torch.zeros(MESSAGE_BYTES // 4)
    extra = []
    for _ in range(rounds):
        idle = torch.zeros(1, dtype=torch.float64)
        dist.barrier()
        if rank < 2:
            idle[0] = _ping_pong(rank, x)
        dist.broadcast(idle, src=0)
        busy = 0.0
        if rank < 2:
            busy = _ping_pong(rank, x)
        else:
            _compute_for(BUSY_FACTOR * 2 * PINGS * float(idle[0]))
        dist.barrier()
        extra.append(max(0.0, busy - float(idle[0])))
    return statistics.median(extra) if rank == 0 else None


def _burst(a: torch.Tensor, b: torch.Tensor) -> None:
    for _ in range(BURST_GEMMS[0]):
        torch.mm(a, b)


def _after_bursts(x: torch.Tensor, group: object, calls: int) -> float:
    """Mean seconds inside an all-reduce of ``x`` issued after each of ``calls`` GEMM bursts."""
    _, m, k, n = BURST_GEMMS
    a, b = torch.randn(m, k), torch.randn(k, n)
    inside = 0.0
    for _ in range(calls):
        _burst(a, b)
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        inside += time.perf_counter() - t0
    return inside / calls


def _back_to_back(x: torch.Tensor, group: object, calls: int) -> float:
    """Mean seconds per all-reduce of ``x`` over ``calls`` of them back to back."""
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x, group=group)
    return (time.perf_counter() - t0) / calls


def _sync_round(rank: int, busy: int, group: object, calls: int) -> tuple[float, float]:
    """One round's (wait per all-reduce in seconds, bus wait in seconds per bus byte), each the
    mean over the busy ranks (module docstring)."""
    flag, large = torch.zeros(1), torch.zeros(BUS_BYTES // 4)
    got = [0.0, 0.0]
    dist.barrier()
    if rank < busy:
        wait = _after_bursts(flag, group, calls) - _back_to_back(flag, group, calls)
        inside = _after_bursts(large, group, calls)
        fastest = min(_back_to_back(large, group, calls) for _ in range(BUS_LOOPS))
        got = [wait, (inside - fastest - wait) / (2 * (busy - 1) / busy * BUS_BYTES)]
    means = torch.tensor(got, dtype=torch.float64)
    dist.all_reduce(means)
    wait, per_byte = (float(v) / busy for v in means)
    return wait, per_byte


def sync_wait_s(
    rank: int, world: int, rounds: int = WAIT_ROUNDS, calls: int = SYNC_CALLS
) -> tuple[dict[int, float], dict[int, float]]:
    """Per number of busy ranks from 2 up to the cores this process may use (and the world):
    the extra seconds of a blocking collective issued after computing, and the extra seconds per
    bus byte of a large one beyond that (module docstring), each the median over ``rounds``, at
    least 0; both empty with one rank or one core."""
    counts = range(2, min(world, cpu_cores()) + 1)
    groups = {busy: dist.new_group(list(range(busy))) for busy in range(2, world + 1)}  # every rank creates each
    waits: dict[int, float] = {}
    per_byte: dict[int, float] = {}
    for busy in counts:
        got = [_sync_round(rank, busy, groups[busy], calls) for _ in range(rounds)]
        waits[busy] = max(0.0, statistics.median(w for w, _ in got))
        per_byte[busy] = max(0.0, statistics.median(b for _, b in got))
    return waits, per_byte
