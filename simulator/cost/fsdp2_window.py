"""Which chunks a runtime pipeline schedule keeps unsharded, and so how often FSDP2 gathers a
unit's parameters in a step when its gradient sync is deferred (simulator.cost.fsdp2_sync).

torch.distributed.pipelining lowers its runtime schedules (``_PipelineScheduleRuntime``:
interleaved 1F1B, the zero-bubble ones) with explicit UNSHARD and RESHARD actions
(torch/distributed/pipelining/schedules.py ``_add_unshard_reshard``, ``max_active_stages=3``):
before each pass it unshards the next three distinct stages (local chunks) the rank will run and
reshards every other one it holds. A chunk leaves that window only right after one of its own
passes, when at least three other chunks run before its next pass (or none comes): the pass
"releases" it, and the chunk's next pass gathers it again. With v <= 3 chunks per rank no chunk
is ever released before the step ends."""

from __future__ import annotations

import functools

import numpy as np

from simulator.cost import schedules, zero3

#: the stages a runtime schedule keeps unsharded at once (``_add_unshard_reshard``'s default)
ACTIVE_STAGES = 3
#: the schedules torch lowers so (``_PipelineScheduleRuntime``)
RUNTIME_SCHEDULES = frozenset({"interleaved", "zbh1", "zbv"})
#: microbatch groups (of p) whose passes :func:`_two_rank_excess` counts one by one; past them
#: the interleaved order repeats, one more group of p microbatches adding what the last one added
EXACT_GROUPS = 4


def windowed(schedule: str, v: int) -> bool:
    """Does the schedule reshard chunks that leave its window (more chunks than it holds)?"""
    return schedule in RUNTIME_SCHEDULES and v > ACTIVE_STAGES


def released_after(chunks: np.ndarray, v: int) -> np.ndarray:
    """Per pass of a rank's order (its local ``chunks``, one of ``v``), does the window reshard
    the pass's chunk right after it: at least :data:`ACTIVE_STAGES` other chunks run before the
    chunk's next pass, or no pass of it follows (:func:`_next_passes`)."""
    return _released(*_next_passes(chunks, v), len(chunks))


def _released(following: np.ndarray, others: np.ndarray, n: int) -> np.ndarray:
    """:func:`released_after` of the passes :func:`_next_passes` describes, of ``n``."""
    return (following == n) | (others >= ACTIVE_STAGES)


def _next_passes(chunks: np.ndarray, v: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pass: the next pass that runs the same chunk (n if none), and how many other chunks
    run before it. ``first_after[c, i]`` is the first pass after ``i`` that runs chunk c (n if
    none); the chunks whose first pass after ``i`` comes before chunk[i]'s own next one are the
    other chunks run in between."""
    n = len(chunks)
    passes = np.arange(n)
    first_after = np.empty((v, n), dtype=np.int64)
    for c in range(v):
        runs_c = np.append(np.flatnonzero(chunks == c), n)
        first_after[c] = runs_c[np.searchsorted(runs_c[:-1], passes, side="right")]
    following = first_after[chunks, passes]
    return following, (first_after < following).sum(axis=0)


@functools.lru_cache(maxsize=4096)
def resharded_before(schedule: str, p: int, m: int, v: int, stage: int) -> tuple[tuple[int, ...], ...]:
    """Per pass of pipeline rank ``stage``'s order (simulator.cost.schedules.device_order), the
    local chunks the window reshards just before it (:func:`released_after`: at most the previous
    pass's chunk); none unless the schedule is :func:`windowed`. The DES's per-pass view."""
    if not windowed(schedule, v):
        return ((),) * len(schedules.device_order(schedule, p, m, v, stage))
    _, chunks = _passes(schedule, p, m, v, stage)
    released = released_after(chunks, v)
    return ((), *((c,) if r else () for c, r in zip(chunks[:-1].tolist(), released[:-1].tolist())))


def _passes(schedule: str, p: int, m: int, v: int, stage: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``stage``'s order as arrays: (is a forward, local chunk) per pass."""
    if schedule == "interleaved" and v > 1:
        forward, _, chunks = schedules.interleaved_passes(p, m, v, stage)
        return forward, chunks
    order = schedules.device_order(schedule, p, m, v, stage)
    return np.array([op.kind == "F" for op in order]), np.array([op.chunk for op in order])


@functools.lru_cache(maxsize=4096)
def rank_gathers(schedule: str, p: int, m: int, v: int, stage: int, zero: int) -> int:
    """The all-gathers of all of rank ``stage``'s chunks in a step with FSDP2's sync deferred,
    pass by pass: each chunk's first pass, and each pass whose chunk's previous pass released it
    (:func:`released_after`) or, at ZeRO-3 (``reshard_after_forward``), was a forward."""
    forward, chunks = _passes(schedule, p, m, v, stage)
    following, others = _next_passes(chunks, v)
    released = _released(following, others, len(chunks))
    if zero < 3:
        return int(released.sum())  # each release but a chunk's last one is followed by a gather
    return v + int(((following < len(chunks)) & (released | forward)).sum())


@functools.lru_cache(maxsize=4096)
def step_gathers(schedule: str, p: int, m: int, v: int, zero: int) -> float:
    """All-gathers per unit and step with FSDP2's sync deferred, averaged over the p ranks and
    their chunks (the closed forms' one figure per plan; the DES follows each rank's own passes):
    1 at ZeRO-2 and m + 1 at ZeRO-3 without a window (simulator.cost.zero3.gathers_per_step), else
    :func:`rank_gathers`. In the interleaved order with m = k p, rank s's forwards lead its
    backwards by 2(p - 1 - s) passes beside whole blocks of p; which chunks run between two passes
    of one chunk depends only on whether that lead is a block or more, so each rank counts as rank
    0 (it is: the first p // 2 ranks) or rank 1 of a two-rank pipeline with k microbatches a rank,
    beyond the m v forwards that gather at ZeRO-3 (:func:`_two_rank_excess`; equal to the mean of
    every rank's pass-by-pass count for p <= 9, 4 <= v <= 8, k <= 7: tests/test_fsdp2_deferred.py)."""
    if not windowed(schedule, v):
        return float(zero3.gathers_per_step(zero, m, True))
    if schedule != "interleaved" or m % p:
        return sum(rank_gathers(schedule, p, m, v, s, zero) for s in range(p)) / (p * v)
    leading = p // 2
    excess = leading * _two_rank_excess(m // p, v, 0, zero) + (p - leading) * _two_rank_excess(m // p, v, 1, zero)
    return (excess / p + (m * v if zero >= 3 else 0)) / v


@functools.lru_cache(maxsize=4096)
def _two_rank_excess(k: int, v: int, stage: int, zero: int) -> int:
    """Rank ``stage``'s gathers in an interleaved two-rank pipeline of 2k microbatches, less the
    2kv forwards that gather at ZeRO-3 (:func:`step_gathers`). Past EXACT_GROUPS groups the order
    repeats group by group: the count at EXACT_GROUPS groups plus (k - EXACT_GROUPS) times what
    one more group adds."""
    if k > EXACT_GROUPS + 1:
        base = _two_rank_excess(EXACT_GROUPS, v, stage, zero)
        return base + (k - EXACT_GROUPS) * (_two_rank_excess(EXACT_GROUPS + 1, v, stage, zero) - base)
    return rank_gathers("interleaved", 2, 2 * k, v, stage, zero) - (2 * k * v if zero >= 3 else 0)
