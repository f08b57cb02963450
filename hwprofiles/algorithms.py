"""Latency step counts of the collective algorithms a communication backend runs.

Ring all-reduce takes 2(n-1) steps, ring all-gather / reduce-scatter n-1 (Patarasuk & Yuan
2009; Thakur et al. 2005). NCCL switches to double binary trees when a collective is
latency-bound (Sanders et al. 2009; NCCL 2.4 release notes), which takes 2*ceil(log2 n) steps,
so an NCCL group pays the fewer of the two. Gloo's all-reduce, all-gather and reduce-scatter
are rings whatever the size (gloo/allreduce.cc: the unspecified algorithm is the ring), so a
gloo group always pays the ring's steps. One rule for the calibration fit
(hwprofiles.calibrate.fit), the closed form (simulator.cost.collectives) and the DES
(simulator.des.flows).
"""

from __future__ import annotations

import functools
import math
from enum import StrEnum


def uses_trees(backend: str) -> bool:
    """Whether ``backend`` picks tree algorithms for latency-bound collectives (NCCL does)."""
    return backend == "nccl"


@functools.lru_cache(maxsize=4096)
def latency_steps(n: int, ring_steps: int, trees: bool = True) -> int:
    """Latency terms of a collective over ``n`` ranks whose ring takes ``ring_steps`` steps:
    ``min(ring_steps, 2*ceil(log2 n))`` with ``trees``, else ``ring_steps``; 0 for one rank."""
    if n <= 1:
        return 0
    return min(ring_steps, 2 * math.ceil(math.log2(n))) if trees else ring_steps


class Collective(StrEnum):
    """The collectives autoplan prices, spelled as NodeProfile.collectives keys."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    SEND_RECV = "send_recv"
    BROADCAST = "broadcast"
