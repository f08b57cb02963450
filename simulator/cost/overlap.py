"""Communication beside compute is never free: the one rule both models apply.

A collective that runs while compute kernels run takes SMs (NCCL's channels are thread
blocks) and HBM bandwidth from them, so the compute slows by ``sigma`` (the GPU profile's
``comm_overlap_slowdown``) for as long as the two overlap (pytorch/pytorch PR #179937:
overlapped matmuls run 30-40% slower; NVIDIA/nccl#338). ``compute`` seconds of kernels with
``comm`` seconds of communication issued beside them take

    overlapped(C, K) = max(C + sigma * min(K, C), K)

and the communication's cost is what that adds to C (:func:`overlap_cost`). With sigma = 0
this is the free-overlap max(C, K).
"""

from __future__ import annotations


def overlapped(compute: float, comm: float, sigma: float) -> float:
    """max(C + sigma * min(K, C), K): the span of C seconds of compute beside K of communication."""
    if comm <= 0:
        return compute
    return max(compute + sigma * min(comm, compute), comm)


def overlap_cost(compute: float, comm: float, sigma: float) -> float:
    """What K seconds of communication beside C seconds of compute add: overlapped(C, K) - C."""
    return overlapped(compute, comm, sigma) - compute
