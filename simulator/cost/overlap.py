"""Communication beside compute is never free: the one rule both models apply.

A collective that runs while compute kernels run takes SMs (NCCL's channels are thread
blocks) and HBM bandwidth from them, so the compute slows by ``sigma`` (the GPU profile's
``comm_overlap_slowdown``) for as long as the two overlap (pytorch/pytorch PR #179937:
overlapped matmuls run 30-40% slower; NVIDIA/nccl#338). ``compute`` seconds of kernels with
``comm`` seconds of communication issued beside them take

    overlapped(C, K) = max(C + sigma * min(K, C), K)

and the communication's cost is what that adds to C (:func:`overlap_cost`). With sigma = 0
this is the free-overlap max(C, K).

Both take numbers or arrays alike (simulator.numeric): the scalar and the batch estimate
call them.
"""

from __future__ import annotations

from typing import Any

from simulator.numeric import maximum, minimum, where


def overlapped(compute: Any, comm: Any, sigma: float) -> Any:
    """max(C + sigma * min(K, C), K): the span of C seconds of compute beside K of communication
    (C without communication, K <= 0)."""
    return where(comm <= 0, compute, maximum(compute + sigma * minimum(comm, compute), comm))


def overlap_cost(compute: Any, comm: Any, sigma: float) -> Any:
    """What K seconds of communication beside C seconds of compute add: overlapped(C, K) - C."""
    return overlapped(compute, comm, sigma) - compute
