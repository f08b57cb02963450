"""Latency step counts of the collective algorithms a communication backend runs.

Ring all-reduce takes 2(n-1) steps, ring all-gather / reduce-scatter n-1 (Patarasuk & Yuan
2009; Thakur et al. 2005). NCCL switches its all-reduce to double binary trees when it is
latency-bound (Sanders et al. 2009; NCCL 2.4 release notes), which takes 2*ceil(log2 n) steps,
so an NCCL all-reduce pays the fewer of the two. NCCL has no tree all-gather or
reduce-scatter: they run as rings, n-1 steps whatever the size (NVIDIA/nccl#1473, #1413;
the PAT algorithm of NCCL 2.23 applies only with one GPU per node, NVIDIA/nccl#1594). Gloo's all-reduce, all-gather and reduce-scatter
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


class Collective(StrEnum):
    """The collectives autoplan prices, spelled as NodeProfile.collectives keys."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    SEND_RECV = "send_recv"
    BROADCAST = "broadcast"


@functools.lru_cache(maxsize=4096)
def latency_steps(n: int, collective: str, trees: bool = True) -> int:
    """Latency terms of ``collective`` over ``n`` ranks: its ring's steps (all-reduce 2(n-1),
    all-gather, reduce-scatter and broadcast n-1), or for an all-reduce with ``trees``
    ``min(2(n-1), 2*ceil(log2 n))``; one hop for send/recv; 0 for one rank."""
    if n <= 1:
        return 0
    if collective == Collective.SEND_RECV:
        return 1
    if collective == Collective.ALL_REDUCE:
        ring = 2 * (n - 1)
        return min(ring, 2 * math.ceil(math.log2(n))) if trees else ring
    if collective in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.BROADCAST):
        return n - 1
    raise ValueError(f"unknown collective {collective!r}")
