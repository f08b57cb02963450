"""Memory-bound ops and attention for ``autoplan calibrate``.

Each op in ``MEMORY_OPS`` runs on tensors of every size in ``settings.mem_elements`` in the
device's default dtype; achieved bandwidth = bytes read + written / work time
(``calibrate_timing.op_seconds``). Bytes per element e (DRAM/HBM traffic of a streaming kernel):
copy 2e (``out.copy_(a)``), add 3e, scale 2e, gelu 2e, dropout 2e + 1 (bool mask),
layer_norm 2e (rows of the model's hidden size), softmax 2e (rows of the sequence length,
the attention-score softmax).

  memory_bandwidth_GBps = the best achieved bandwidth over all (op, size)
  memory_efficiency     = median over all (op, size) of achieved / best
(the roofline of DESIGN.md section 4 divides an op's bytes by their product).

Attention: ``F.scaled_dot_product_attention`` on (batch, heads, seq, head_dim) tensors,
4*b*a*s^2*d FLOPs (QK^T and PV) over its work time; reported in ``measured`` only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from hwprofiles.calibrate_settings import MEMORY_OPS, Settings
from hwprofiles.calibrate_timing import TORCH_DTYPES, op_seconds


@dataclass(frozen=True)
class MemoryResult:
    bandwidth_GBps: float                      # best achieved (op, size)
    efficiency: float                          # median achieved / best
    best_op: str
    by_op_GBps: dict[str, float] = field(default_factory=dict)   # median over sizes, per op
    attention_tflops: dict[str, float] = field(default_factory=dict)


def _row_widths(device: str) -> tuple[int, int]:
    """(layer_norm width, softmax width): the hidden size and sequence length of the typical
    runs of the device: the tiny model (128, 64) on CPU, a large model (4096, 2048) on CUDA."""
    return (128, 64) if device == "cpu" else (4096, 2048)


def _memory_op(name: str, n: int, device: str, dtype: torch.dtype) -> tuple[Callable[[], object], float]:
    """(fn, bytes moved) for op ``name`` on ``n`` elements."""
    e = torch.tensor([], dtype=dtype).element_size()
    a = torch.randn(n, device=device).to(dtype)
    b = torch.randn(n, device=device).to(dtype)
    out = torch.empty_like(a)
    ln_w, sm_w = _row_widths(device)
    ln_w, sm_w = min(ln_w, n), min(sm_w, n)
    gamma = torch.ones(ln_w, device=device, dtype=dtype)
    ops: dict[str, tuple[Callable[[], object], float]] = {
        "copy": (lambda: out.copy_(a), 2 * e * n),
        "add": (lambda: a + b, 3 * e * n),
        "scale": (lambda: a * 1.5, 2 * e * n),
        "gelu": (lambda: F.gelu(a), 2 * e * n),
        "dropout": (lambda: F.dropout(a, 0.1, training=True), (2 * e + 1) * n),
        "layer_norm": (lambda: F.layer_norm(a.view(-1, ln_w), (ln_w,), gamma, gamma), 2 * e * n),
        "softmax": (lambda: F.softmax(a.view(-1, sm_w), -1), 2 * e * n),
    }
    return ops[name]


def measure_memory(settings: Settings, dtype: str, dispatch_s: float, tick: Callable[[str], None]) -> MemoryResult:
    """Bandwidth of every (op, size); the peak and the median efficiency (module docstring)."""
    tdt = TORCH_DTYPES[dtype]
    bw: dict[tuple[str, int], float] = {}
    for name in MEMORY_OPS:
        for n in settings.mem_elements:
            fn, nbytes = _memory_op(name, n, settings.device, tdt)
            t = op_seconds(fn, settings.device, settings.min_time_s, settings.repeats, dispatch_s)
            bw[(name, n)] = nbytes / t / 1e9
            tick(f"{name} {n} elements")
    (best_op, _), best = max(bw.items(), key=lambda kv: kv[1])
    eff = statistics.median(v / best for v in bw.values())
    by_op = {name: statistics.median(bw[(name, n)] for n in settings.mem_elements) for name in MEMORY_OPS}
    return MemoryResult(bandwidth_GBps=best, efficiency=min(1.0, eff), best_op=best_op, by_op_GBps=by_op,
                        attention_tflops=_measure_attention(settings, tdt, dispatch_s, tick))


def _measure_attention(settings: Settings, tdt: torch.dtype, dispatch_s: float,
                       tick: Callable[[str], None]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b, a, s, d in settings.attention_shapes:
        q, k, v = (torch.randn(b, a, s, d, device=settings.device).to(tdt) for _ in range(3))
        t = op_seconds(lambda: F.scaled_dot_product_attention(q, k, v), settings.device, settings.min_time_s,
                       settings.repeats, dispatch_s)
        out[f"b{b}_a{a}_s{s}_d{d}"] = 4.0 * b * a * s * s * d / t / 1e12
        tick(f"attention b{b} a{a} s{s} d{d}")
    return out
