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
~370-670 us with the two other ranks computing). Call on every rank.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from hwprofiles.calibrate.reference_layers import layer_training_step
from hwprofiles.calibrate.settings import WAIT_ROUNDS

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
