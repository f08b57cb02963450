"""Pipeline schedules: the order in which one pipeline rank runs its forward and backward passes.

* GPipe (Huang et al. 2019): all m forwards, then all m backwards, the last microbatch first
  (its activations are still resident, so with checkpointing it need not be recomputed).
* 1F1B / PipeDream-Flush (Narayanan et al. 2021, section 2.2): stage s runs
  min(p - s - 1, m) warm-up forwards, then alternates one forward and one backward,
  then drains the remaining backwards.
* Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2; Megatron-LM
  ``forward_backward_pipelining_with_interleaving``): v model chunks per rank; the k-th
  forward of a rank belongs to chunk (k mod pv) // p and microbatch (k // pv)*p + k mod p;
  backwards visit chunks in reverse; warm-up = (p - s - 1)*2 + (v - 1)*p forwards (all of
  them when m = p), then 1F1B, then cool-down.
* Zero bubble ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 3), as
  ``torch.distributed.pipelining.ScheduleInterleavedZeroBubble`` runs it with one stage per rank
  (``_get_1f1b_rank_ops(enable_zero_bubble=True)``): the backward splits into 'B', the input
  gradient (what the previous stage waits for), and 'W', the weight gradient, which no one waits
  for. Stage s runs min(p - s - 1, m) warm-up forwards, then F, B and, once s microbatches have
  been through B, the W of the oldest one; then the remaining B's (each with a W) and W's.
* Zero bubble ZB-V (Qi et al. 2024, section 6), as ``torch.distributed.pipelining.
  ScheduleZBVZeroBubble`` runs it (``_calculate_single_rank_operations``): two chunks per rank in a
  V, rank s holding global chunks s and 2p-1-s, so the forward runs down the ranks and back up and
  the turn (chunks p-1 and p on rank p-1) needs no send; rank s idles s slots, runs 2(p-s)-1
  chunk-0 forwards, s pairs of (chunk-1, chunk-0) forwards, p-s rounds of a chunk-1 F, B and W,
  then F/B/W of chunk 0 and of chunk 1 in turn while forwards remain, then the cool-down's B's,
  the chunk-0 W's beside them and the remaining W's; torch plans with max(2p-1, m) microbatches
  and drops the passes of the ones beyond m.
With uniform stages and free communication the bubble is (p-1)/m of the ideal time for
GPipe and 1F1B and (p-1)/(v m) for the interleaved schedule (tests check it in the DES); ZB-H1's
is (p-1)(F + B - W) instead of (p-1)(F + B + W) (ibid.), ZB-V's half of it (its chunks are half a
rank's layers), which is zero when F = B = W.

Chunks: global chunk j holds the j-th block of layers; rank s runs local chunks c = 0..v-1,
global chunk c*p + s (looped placement), or under ZB-V s and 2p-1-s (:func:`global_chunk`).
Forward of (mb, j) needs forward of (mb, j-1); backward of (mb, j) needs backward of (mb, j+1).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PipeOp(NamedTuple):
    """One pass of one microbatch through one local chunk: kind 'F', 'B' (the whole backward, or
    under ZB-H1 its input-gradient part) or 'W' (ZB-H1's weight-gradient part)."""

    kind: str
    mb: int
    chunk: int


def compute_share(schedule: str, p: int, v: int, m: int) -> float:
    """The share of a step a pipeline rank spends in its passes, with uniform stages and free
    communication (the bubbles above): 1 / (1 + (p - 1) / (v m)) = v m / (v m + p - 1) for GPipe,
    1F1B (v = 1) and the interleaved schedule; 1 for ZB-H1 and ZB-V, whose weight passes fill
    their bubble (taken as full), and without a pipeline."""
    if p == 1 or schedule in ("zbh1", "zbv"):
        return 1.0
    chunks = v if schedule == "interleaved" else 1
    return chunks * m / (chunks * m + p - 1)


def gpipe(m: int) -> list[PipeOp]:
    return [PipeOp("F", i, 0) for i in range(m)] + [PipeOp("B", i, 0) for i in reversed(range(m))]


def one_f_one_b(p: int, m: int, stage: int) -> list[PipeOp]:
    warm = min(p - stage - 1, m)
    ops = [PipeOp("F", i, 0) for i in range(warm)]
    for i in range(m - warm):
        ops.append(PipeOp("F", warm + i, 0))
        ops.append(PipeOp("B", i, 0))
    ops += [PipeOp("B", i, 0) for i in range(m - warm, m)]
    return ops


def zero_bubble_h1(p: int, m: int, stage: int) -> list[PipeOp]:
    """ZB-H1 (module docstring): the W of a microbatch trails its B by ``stage`` microbatches."""
    warm = min(p - stage - 1, m)
    ops = [PipeOp("F", i, 0) for i in range(warm)]
    for i in range(m):  # after the warm-up: F (while any remain), B, and a W once `stage` B's are done
        if warm + i < m:
            ops.append(PipeOp("F", warm + i, 0))
        ops.append(PipeOp("B", i, 0))
        if i >= stage:
            ops.append(PipeOp("W", i - stage, 0))
    ops += [PipeOp("W", i, 0) for i in range(max(0, m - stage), m)]
    return ops


def zero_bubble_v(p: int, m: int, stage: int) -> list[PipeOp]:
    """ZB-V (module docstring): rank ``stage``'s passes of its local chunks 0 (global ``stage``)
    and 1 (global 2p-1-``stage``), B the input gradient, in torch's order."""
    n = max(2 * p - 1, m)
    raw: list[tuple[str, int, int]] = []  # (kind, microbatch, local chunk), before dropping mb >= m
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - stage) - 1):
        raw.append(("F", f0, 0))
        f0 += 1
    for _ in range(stage):
        raw += [("F", f1, 1), ("F", f0, 0)]
        f0, f1 = f0 + 1, f1 + 1
    for _ in range(p - stage):
        raw += [("F", f1, 1), ("B", b1, 1), ("W", b1, 1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            raw.append(("F", f0, 0))
            f0 += 1
        raw += [("B", b0, 0), ("W", b0, 0), ("F", f1, 1), ("B", b1, 1), ("W", b1, 1)]
        f1, b0, b1 = f1 + 1, b0 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(stage):
        raw += [("B", b0, 0), ("B", b1, 1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(p - stage):
        raw += [("B", b0, 0), ("W", w0, 0)]
        b0, w0 = b0 + 1, w0 + 1
    raw += [("W", i, 1) for i in range(w1, b1)] + [("W", i, 0) for i in range(w0, b0)]
    return [PipeOp(kind, mb, chunk) for kind, mb, chunk in raw if mb < m]  # torch leaves those slots empty


def interleaved_passes(p: int, m: int, v: int, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank ``stage``'s interleaved order as arrays, pass by pass: (is a forward, microbatch,
    local chunk). The k-th forward runs chunk (k mod pv) // p of microbatch (k // pv)*p + k mod p,
    the k-th backward chunk v - 1 - (k mod pv) // p of the same microbatch; ``warm`` forwards, then
    one forward and one backward in turn, then the remaining backwards."""
    total = m * v
    warm = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)
    k = np.arange(total)
    forward_chunk = (k % (p * v)) // p
    microbatch = (k // (p * v)) * p + k % p
    steady = total - warm
    index = np.concatenate([k[:warm], np.stack([k[warm:], k[:steady]], axis=1).ravel(), k[steady:]])
    forward = np.concatenate([np.ones(warm, bool), np.tile([True, False], steady), np.zeros(warm, bool)])
    chunk = np.where(forward, forward_chunk[index], v - 1 - forward_chunk[index])
    return forward, microbatch[index], chunk


def interleaved(p: int, m: int, v: int, stage: int) -> list[PipeOp]:
    forward, microbatch, chunk = interleaved_passes(p, m, v, stage)
    kinds = np.where(forward, "F", "B").tolist()
    return [PipeOp(*op) for op in zip(kinds, microbatch.tolist(), chunk.tolist())]


def device_order(schedule: str, p: int, m: int, v: int, stage: int) -> list[PipeOp]:
    """The ordered passes of pipeline rank ``stage``."""
    if schedule == "gpipe":
        return gpipe(m)
    if schedule == "interleaved" and v > 1:
        return interleaved(p, m, v, stage)
    if schedule == "zbh1":
        return zero_bubble_h1(p, m, stage)
    if schedule == "zbv":
        return zero_bubble_v(p, m, stage)
    return one_f_one_b(p, m, stage)


def global_chunk(schedule: str, local_chunk: int, stage: int, p: int) -> int:
    """The model-order chunk that rank ``stage`` runs as its ``local_chunk``: c*p + stage, or
    under ZB-V stage and 2p-1-stage."""
    if schedule == "zbv":
        return stage if local_chunk == 0 else 2 * p - 1 - stage
    return local_chunk * p + stage


def chunk_rank(schedule: str, chunk: int, p: int) -> int:
    """The pipeline rank that runs model-order chunk ``chunk``."""
    if schedule == "zbv":
        return chunk if chunk < p else 2 * p - 1 - chunk
    return chunk % p


def rank_chunks(schedule: str, p: int, v: int) -> list[list[int]]:
    """The model-order chunks of each pipeline rank, in local chunk order."""
    return [[global_chunk(schedule, c, s, p) for c in range(v)] for s in range(p)]
