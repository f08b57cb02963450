"""Memory-bound ops and attention for ``autoplan calibrate``.

Each op in ``MEMORY_OPS`` runs on tensors of every size in ``settings.mem_elements`` in the
device's default dtype; achieved bandwidth = bytes read + written / work time
(``calibrate.timing.op_seconds``; on CPU the dispatch time subtracted is that of the same op
on a one-element tensor). Bytes per element e (DRAM/HBM traffic of a streaming kernel):
copy 2e (``out.copy_(a)``), add 3e, scale 2e, gelu 2e (tanh form, as the runtime's MLP),
dropout 2e + 1 (bool mask), layer_norm 2e (rows of the model's hidden size), softmax 2e (rows
of the sequence length, the attention-score softmax).

  memory_bandwidth_GBps = the median copy bandwidth over the sizes (STREAM "copy"; the
                          median, not the best, because at the smallest sizes the work is
                          a fraction of the dispatch time subtracted, and the quotient is noisy)
  memory_efficiency     = median over the other ops and all sizes of achieved / that copy
                          bandwidth (capped at 1)
The roofline of docs/design.md section 4 divides an op's bytes by their product, so a typical
elementwise op comes out at its measured speed, whether memory or (on a CPU core: gelu,
softmax, dropout's random numbers) arithmetic limits it.

Attention is measured by ``calibrate.attention``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hwprofiles.calibrate.settings import MEMORY_OPS, Settings
from hwprofiles.calibrate.timing import TORCH_DTYPES, raw_seconds, seconds_per_call, work_seconds
from hwprofiles.units import GB


@dataclass(frozen=True)
class MemoryResult:
    bandwidth_GBps: float  # median copy bandwidth over the sizes
    efficiency: float  # median over other ops x sizes of achieved / best copy
    by_op_GBps: dict[str, float] = field(default_factory=dict)  # median over sizes, per op


def _row_widths(device: str) -> tuple[int, int]:
    """(layer_norm width, softmax width): the hidden size and sequence length of the typical
    runs of the device: the tiny model (128, 64) on CPU, a large model (4096, 2048) on CUDA."""
    return (128, 64) if device == "cpu" else (4096, 2048)


#: bytes read + written per element, as (bytes per element of the dtype, extra bytes)
_TRAFFIC: dict[str, tuple[int, int]] = {
    "copy": (2, 0),
    "add": (3, 0),
    "scale": (2, 0),
    "gelu": (2, 0),
    "dropout": (2, 1),
    "layer_norm": (2, 0),
    "softmax": (2, 0),
}


def _memory_bytes(name: str, n: int, dtype: torch.dtype) -> float:
    """Bytes op ``name`` reads and writes on ``n`` elements (module docstring)."""
    per_e, extra = _TRAFFIC[name]
    return float((per_e * torch.empty(0, dtype=dtype).element_size() + extra) * n)


def _memory_op(name: str, n: int, device: str, dtype: torch.dtype) -> Callable[[], object]:
    """One call of op ``name`` on ``n`` elements."""
    a = torch.randn(n, device=device).to(dtype)
    b = torch.randn(n, device=device).to(dtype)
    out = torch.empty_like(a)
    ln_w, sm_w = _row_widths(device)
    ln_w, sm_w = min(ln_w, n), min(sm_w, n)
    gamma = torch.ones(ln_w, device=device, dtype=dtype)
    ops: dict[str, Callable[[], object]] = {
        "copy": lambda: out.copy_(a),
        "add": lambda: a + b,
        "scale": lambda: a * 1.5,
        "gelu": lambda: F.gelu(a, approximate="tanh"),
        "dropout": lambda: F.dropout(a, 0.1, training=True),
        "layer_norm": lambda: F.layer_norm(a.view(-1, ln_w), (ln_w,), gamma, gamma),
        "softmax": lambda: F.softmax(a.view(-1, sm_w), -1),
    }
    return ops[name]


def _tiny_seconds(fn: Callable[[], object], settings: Settings) -> float:
    """CPU: the time of an op on a one-element input (subtracted as its dispatch); CUDA: unused, 0."""
    if settings.device != "cpu":
        return 0.0
    return seconds_per_call(fn, settings.device, settings.timing)


def measure_memory(settings: Settings, dtype: str, tick: Callable[[str], None]) -> MemoryResult:
    """Bandwidth of every (op, size); the peak and the median efficiency (module docstring)."""
    tdt = TORCH_DTYPES[dtype]
    raw: dict[tuple[str, int], float] = {}
    base: dict[str, float] = {}
    for _ in range(settings.passes):  # best time of each (op, size) and each base, as the GEMMs
        for name in MEMORY_OPS:
            tiny = _tiny_seconds(_memory_op(name, 1, settings.device, tdt), settings)
            base[name] = min(base.get(name, float("inf")), tiny)
            for n in settings.mem_elements:
                t = raw_seconds(_memory_op(name, n, settings.device, tdt), settings.device, settings.timing)
                raw[(name, n)] = min(raw.get((name, n), float("inf")), t)
                tick(f"{name} {n} elements")
    bw = {
        (name, n): _memory_bytes(name, n, tdt) / work_seconds(t, base[name], settings.device) / GB
        for (name, n), t in raw.items()
    }
    by_op = {name: statistics.median(bw[(name, n)] for n in settings.mem_elements) for name in MEMORY_OPS}
    copy = by_op["copy"]
    eff = statistics.median(v / copy for (name, _), v in bw.items() if name != "copy")
    return MemoryResult(
        bandwidth_GBps=copy,
        efficiency=min(1.0, eff),
        by_op_GBps=by_op,
    )
