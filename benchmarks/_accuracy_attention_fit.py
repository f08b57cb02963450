"""The fit of a GPU profile's FlashAttention-2 figures (its ``attention_kernels: flash-attn-2``
entry, the kernels llm-foundry's MPT runs: Runtime.attention_kernel) to the MosaicML MPT rows
of that GPU class with s >= 8192 in bf16 (validation/published-fsdp.yaml; benchmarks/accuracy.py
``--fit``). At those lengths attention is 45-90% of a step, so these rows measure the kernel;
the shorter rows and the fp8 rows are held out.

The entry prices the kernel's efficiency on the executed (causal-half) FLOPs as
``top * s / (s + half_seq)`` (hwprofiles.schema.gpu.AttentionModel), with a forward and a
backward top. The fit keeps the profile's backward/forward ratio and chooses the scale of the
two tops and ``half_seq``, minimizing the sum over the rows of |log(predicted / measured
tokens/s)|: the least absolute error, so that a row no setting explains (mpt_30b on 8 H100 at
s = 8192, predicted 27% fast whatever the attention) does not pull the curve. ``half_seq`` is
searched on a grid of 100 (300 .. 2000), the scale by golden section at each.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from _accuracy_fsdp import FsdpRow, fsdp_rows

from hwprofiles.schema import AttentionModel
from simulator.analytic import estimate
from simulator.job import Job

KERNEL = "flash-attn-2"
FIT_MIN_SEQ = 8192
HALF_SEQ_GRID = range(300, 2001, 100)
SCALE_RANGE = (0.5, 2.0)


@dataclass(frozen=True)
class AttentionFit:
    """The fitted entry, its rows and its summed |log error| before and after."""

    entry: AttentionModel
    rows: int
    loss_before: float
    loss_after: float


def fit_rows(gpu_label: str) -> list[FsdpRow]:
    """The fit subset: MosaicML's bf16 rows on ``gpu_label`` (e.g. "H100-80GB") with s >= 8192."""
    return [
        r
        for r in fsdp_rows()
        if r.source == "mosaicml_mpt"
        and r.job is not None
        and f" {gpu_label} " in r.label
        and r.job.plan.prec == "bf16"
        and r.job.model.seq_length >= FIT_MIN_SEQ
    ]


def with_entry(job: Job, entry: AttentionModel) -> Job:
    """``job`` on a GPU whose FlashAttention-2 entry is ``entry`` (its runtime kept)."""
    c = job.cluster
    kernels = {**c.gpu.attention_kernels, KERNEL: entry}
    gpu = c.gpu.model_copy(update={"attention_kernels": kernels})
    return dataclasses.replace(job, cluster=c.model_copy(update={"node": c.node.model_copy(update={"gpu": gpu})}))


def loss(rows: list[FsdpRow], entry: AttentionModel) -> float:
    """Sum over ``rows`` of |log(predicted / measured tokens/s)| with the entry ``entry``."""
    total = 0.0
    for r in rows:
        assert r.job is not None
        step = estimate(with_entry(r.job, entry)).step_time
        total += abs(math.log(r.predicted_tok_s_gpu(step) / r.tok_s_gpu))
    return total


def scaled(entry: AttentionModel, scale: float, half_seq: float) -> AttentionModel:
    """``entry`` with both tops times ``scale`` (capped at 1) and ``half_seq``."""
    return entry.model_copy(
        update={
            "forward_efficiency": min(1.0, entry.forward_efficiency * scale),
            "backward_efficiency": min(1.0, entry.backward_efficiency * scale),
            "half_seq": float(half_seq),
        }
    )


def _golden(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-3) -> tuple[float, float]:
    """(x, f(x)) at the minimum of a unimodal ``f`` on [lo, hi], by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (c, fc) if fc < fd else (d, fd)


def fit_flash_attention(gpu_label: str, entry: AttentionModel, log: Callable[[str], None] = print) -> AttentionFit:
    """The fitted entry of the GPU class ``gpu_label`` from its current ``entry`` (module docstring)."""
    rows = fit_rows(gpu_label)
    before = loss(rows, entry)
    best: tuple[float, float, float] | None = None  # (loss, scale, half_seq)
    for half in HALF_SEQ_GRID:
        scale, value = _golden(lambda k, h=half: loss(rows, scaled(entry, k, h)), *SCALE_RANGE)
        if best is None or value < best[0]:
            best = (value, scale, half)
    assert best is not None
    value, scale, half = best
    fitted = scaled(entry, scale, half)
    log(
        f"  {gpu_label} {KERNEL}: forward {fitted.forward_efficiency:.3f}, backward {fitted.backward_efficiency:.3f}, "
        f"half_seq {half} over {len(rows)} rows (sum |log error| {before:.3f} -> {value:.3f}; "
        f"profile: {entry.forward_efficiency}, {entry.backward_efficiency}, {entry.half_seq:g})"
    )
    return AttentionFit(fitted, len(rows), before, value)
