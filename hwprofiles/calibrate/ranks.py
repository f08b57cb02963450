"""What the collective benchmark's ranks (``calibrate.comm``) measure besides collectives.

Compute slots (CPU): for 2, 3, ... all ranks busy, the aggregate throughput of a
single-threaded training loop (forward, backward and AdamW step of the reference GPT layer,
hidden 256, 128 tokens) run by that many ranks at once, in units of its throughput run by
rank 0 alone (cores that share a physical core or a host's memory bandwidth give less than
one slot each; ranks beyond the cores add nothing, and time-sliced ranks evict each other's
caches, which costs more). As in training, the busy ranks synchronize after every pass (a
scalar all-reduce), so a rank the scheduler left behind holds the others up; the time of the
same all-reduces alone is taken out (the simulator prices collectives on the link).

Tensor-parallel layer: the ranks time the tensor-parallel reference layer's host work
against the plain layer's (``calibrate.eager.tp_layer_ratios``) in groups of 2 (all ranks
when their number is odd), one group at a time so that its ranks have cores of their own, in
``EAGER_ROUNDS`` turns: per rank the median, then the mean over ranks.

Call every function here on every rank of the process group.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hwprofiles.calibrate.eager import TpRatios, tp_layer_ratios
from hwprofiles.calibrate.host import cpu_cores
from hwprofiles.calibrate.reference_layers import LayerSplit, layer_training_step
from hwprofiles.calibrate.settings import EAGER_ROUNDS, SLOT_ROUNDS


def _mean_over_ranks(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t)
    return [float(x) / dist.get_world_size() for x in t.tolist()]


def _layer_loop(calls: int, sync: Callable[[], None] | None = None) -> tuple[float, float]:
    """(start, end) wall-clock times of ``calls`` training steps of the reference GPT layer
    (``calibrate.reference_layers.layer_training_step``), after 3 untimed; ``sync`` after each
    step (the busy ranks' scalar all-reduce)."""
    step = layer_training_step()
    for _ in range(3):
        step()
    t0 = time.time()
    for _ in range(calls):
        step()
        if sync is not None:
            sync()
    return t0, time.time()


def _all_reduces(calls: int, flag: torch.Tensor, group: Any) -> float:
    """Seconds of ``calls`` back-to-back scalar all-reduces over ``group``."""
    t0 = time.time()
    for _ in range(calls):
        dist.all_reduce(flag, group=group)
    return time.time() - t0


def _slots_round(rank: int, busy: int, calls: int, device: torch.device, group: Any) -> float:
    """One alternation: rank 0's loop alone; ranks 0..busy-1 at once, each synchronizing the
    busy ranks with a scalar all-reduce after every pass (as training steps do); the same
    all-reduces alone. The throughput ratio: busy * solo / (span - all-reduces alone)."""
    world = dist.get_world_size()
    flag = torch.zeros(1)
    dist.barrier()
    solo = 0.0
    if rank == 0:
        t0, t1 = _layer_loop(calls)
        solo = t1 - t0
    dist.barrier()
    start, end = (
        _layer_loop(calls, lambda: dist.all_reduce(flag, group=group)) if rank < busy else (math.inf, -math.inf)
    )
    dist.barrier()
    alone = _all_reduces(calls, flag, group) if rank < busy else 0.0
    solo, alone = (x * world for x in _mean_over_ranks([solo, alone / busy], device))
    first = torch.tensor([start], dtype=torch.float64)
    last = torch.tensor([end], dtype=torch.float64)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    dist.all_reduce(last, op=dist.ReduceOp.MAX)
    return busy * solo / max(float(last.item() - first.item()) - alone, 1e-9)


def compute_slots(rank: int, device: torch.device, loop_s: float, rounds: int = SLOT_ROUNDS) -> dict[int, float]:
    """For every number of busy ranks from 2 to all: the throughput of their synchronized layer
    loops at once in units of rank 0's loop alone (module docstring); the median over
    ``rounds`` alternations of the two, as a shared host's speed drifts, capped at the busy
    ranks and at the cores this process may use."""
    t0, t1 = _layer_loop(5)
    calls_t = torch.tensor([max(5, int(loop_s / max((t1 - t0) / 5, 1e-9)))])
    dist.all_reduce(calls_t, op=dist.ReduceOp.MAX)  # the same number on every rank: they synchronize
    calls = int(calls_t.item())
    world = dist.get_world_size()
    groups = {busy: dist.new_group(list(range(busy))) for busy in range(2, world + 1)}  # every rank creates each
    slots = {}
    for busy in range(2, world + 1):
        ratio = statistics.median(_slots_round(rank, busy, calls, device, groups[busy]) for _ in range(rounds))
        slots[busy] = min(float(busy), float(cpu_cores()), ratio)
    return slots


def tp_ratios(
    world: int, device: torch.device, repeats: int, split_layer: LayerSplit, rounds: int = EAGER_ROUNDS
) -> TpRatios:
    """Every rank times the TP reference layer against the plain one (passes, optimizer step per
    tensor: ``calibrate.eager.tp_layer_ratios``) in its group of 2, one group at a time (the
    others wait at a barrier, so the group's ranks have cores of their own), ``rounds`` turns
    each; per rank the median of each ratio, then the mean over ranks (module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh

    tp = 2 if world % 2 == 0 else world
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    mine = dist.get_rank() // tp
    turns: list[TpRatios] = []
    for _ in range(rounds):
        for group in range(world // tp):
            if group == mine:
                turns.append(tp_layer_ratios(mesh["tp"], device.type, repeats, split_layer))
            dist.barrier()
    medians = [statistics.median(getattr(r, k) for r in turns) for k in ("forward", "backward", "optimizer")]
    return TpRatios(*_mean_over_ranks(medians, device))
