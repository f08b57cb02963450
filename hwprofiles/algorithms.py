"""Latency step counts of the collective algorithms a communication backend runs.

Ring all-reduce takes 2(n-1) steps, ring all-gather / reduce-scatter n-1 (Patarasuk & Yuan
2009; Thakur et al. 2005). NCCL switches its all-reduce to double binary trees when it is
latency-bound (Sanders et al. 2009; NCCL 2.4 release notes), which takes 2*ceil(log2 n) steps,
so an NCCL all-reduce pays the fewer of the two. NCCL has no tree all-gather or
reduce-scatter: they run as rings, n-1 steps whatever the size (NVIDIA/nccl#1473, #1413;
the PAT algorithm of NCCL 2.23 applies only with one GPU per node, NVIDIA/nccl#1594). Gloo's all-reduce, all-gather and reduce-scatter
are rings whatever the size (gloo/allreduce.cc: the unspecified algorithm is the ring), so a
gloo group always pays the ring's steps.

Where the steps go: a ring over n ranks on N nodes crosses a node boundary N-1 times per pass
and NVLink (or PCIe) the other n-N times, so NCCL's tuning model charges a ring all-gather or
reduce-scatter (n-N) intra-node and (N-1) inter-node step latencies, twice that for an
all-reduce (src/graph/tuning.cc ``ncclTopoTuneModel``, NCCL 2.9.9: ``(nsteps-nInterSteps)*intraLat
+ nInterSteps*interLat``, with nInterSteps = N-1 or 2(N-1)); the double binary tree crosses nodes
at its top 2*ceil(log2 N) levels (:func:`latency_split`). One rule for the calibration fit
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


def latency_split(n: int, nodes: int, collective: str, trees: bool, intra_s: float, inter_s: float) -> tuple[int, int]:
    """(intra-node steps, inter-node steps) of ``collective`` over ``n`` ranks on ``nodes`` nodes,
    for the algorithm that pays less latency at ``intra_s`` / ``inter_s`` seconds per step
    (module docstring). The ring: (n-N, N-1) for an all-gather, reduce-scatter or broadcast,
    (2(n-N), 2(N-1)) for an all-reduce (NCCL 2.9.9 tuning.cc). An NCCL all-reduce may run as
    double binary trees instead (``trees``): :func:`latency_steps`' 2*ceil(log2 n) steps, of
    which the top 2*ceil(log2 N) cross nodes. One step for send/recv, across nodes when N > 1.
    In one node every step is intra-node: the sum is :func:`latency_steps`."""
    if n <= 1:
        return 0, 0
    big = max(1, min(nodes, n))
    if collective == Collective.SEND_RECV:
        return (0, 1) if big > 1 else (1, 0)
    per = 2 if collective == Collective.ALL_REDUCE else 1
    ring = (per * (n - big), per * (big - 1))
    steps = latency_steps(n, collective, trees)
    if steps >= sum(ring):
        return ring
    inter = min(steps, 2 * math.ceil(math.log2(big))) if big > 1 else 0
    tree = (steps - inter, inter)
    return tree if _seconds(tree, intra_s, inter_s) < _seconds(ring, intra_s, inter_s) else ring


def _seconds(split: tuple[int, int], intra_s: float, inter_s: float) -> float:
    return split[0] * intra_s + split[1] * inter_s


def latency_seconds(n: int, nodes: int, collective: str, trees: bool, intra_s: float, inter_s: float) -> float:
    """Seconds of latency of ``collective`` over ``n`` ranks on ``nodes`` nodes: its
    :func:`latency_split` steps at ``intra_s`` and ``inter_s`` seconds each."""
    return _seconds(latency_split(n, nodes, collective, trees, intra_s, inter_s), intra_s, inter_s)
