"""The layer partition's optimum without memory limits, in closed form (autoplan.partition).

Without memory constraints recomputation only adds time, so the optimum recomputes nothing
(or what the plan pins, at a fixed cost per layer), and the pipeline time of the partition model
    (m - 1) * max_i T_i + sum_i T_i,        interleaved: m * v * max_i T_i + sum_i T_i - max_i T_i,
    T_i = N_i * P + E [device i holds chunk 0] + H [device i holds the last chunk]
has a constant sum (L * P + E + H), so it is least where the slowest device is fastest: N_i
layers on device i (its chunks' layers, each chunk at least one, a device's chunks within one
layer of each other), sum N_i = L, minimizing max_i (N_i P + x_i). The least such maximum T* is
the smallest T at which every device can take floor((T - x_i) / P) >= v layers and together
they take L (a binary search over integer microseconds); the devices then take those counts,
and the surplus is given back first by the devices that come first in the pipeline (under 1F1B
the first stages hold the most microbatches in flight, so the split most likely meets memory),
never below v. A device's layers are spread over its chunks as evenly as possible, its later
chunks taking the remainder. The same optimum CP-SAT proves for the memory-free model, in
microseconds of Python instead of tens of milliseconds of solving; ties may be split otherwise.
"""

from __future__ import annotations

from typing import Any

from simulator.cost.schedules import rank_chunks


def pipeline_objective(worst: Any, total: Any, m: int, v: int, interleaved: bool) -> Any:
    """The partition model's objective (module docstring) from the slowest device's time per
    microbatch ``worst`` and the devices' sum ``total``: numbers, or CP-SAT expressions (the
    model states its objective with it)."""
    if interleaved and v > 1:
        return m * v * worst + total - worst
    return (m - 1) * worst + total


def device_extras(schedule: str, p: int, v: int, emb: int, head: int) -> list[int]:
    """Each device's time per microbatch besides its layers: E where it holds chunk 0, H where it
    holds the last chunk (both on device 0 under ZB-V)."""
    last = p * v - 1
    return [(emb if 0 in ids else 0) + (head if last in ids else 0) for ids in rank_chunks(schedule, p, v)]


def least_worst(extras: list[int], per_layer: int, layers: int, v: int) -> int:
    """The least max_i (N_i * P + x_i) over N_i >= v with sum N_i = ``layers`` (module docstring),
    by binary search over integer microseconds; ``per_layer`` P > 0, ``layers`` >= v * devices."""
    lo, hi = max(extras) + v * per_layer, max(extras) + layers * per_layer
    while lo < hi:
        mid = (lo + hi) // 2
        if sum((mid - x) // per_layer for x in extras) >= layers:
            hi = mid
        else:
            lo = mid + 1
    return lo


def balanced_layers(schedule: str, p: int, v: int, layers: int, per_layer: int, extras: list[int]) -> tuple[int, ...]:
    """Layers per chunk (model order) of the memory-free optimum (module docstring) for devices
    whose layers cost ``per_layer`` microseconds each, besides ``extras`` each
    (:func:`device_extras`)."""
    worst = least_worst(extras, per_layer, layers, v)
    counts = [(worst - x) // per_layer for x in extras]
    surplus = sum(counts) - layers
    for i, n in enumerate(counts):  # the first devices give back the surplus first
        back = min(surplus, n - v)
        counts[i], surplus = n - back, surplus - back
    split = [0] * (p * v)
    for ids, n in zip(rank_chunks(schedule, p, v), counts):
        q, r = divmod(n, v)
        for k, c in enumerate(ids):
            split[c] = q + (k >= v - r)
    return tuple(split)
