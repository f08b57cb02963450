"""Per-op overhead for ``autoplan calibrate``: the time an op costs beyond its arithmetic.

* ``dispatch_s``: an op on a tiny tensor with autograd off (dispatcher, allocation, kernel
  launch); the median over a handful of op kinds. On CPU it is subtracted from GEMM and
  memory-op timings so the tables hold the work alone.
* ``forward_op_s`` / ``backward_op_s``: a chain of tiny ops shaped like the runtime's
  transformer layer (layer_norm, linear, gelu, linear, residual add, softmax) with autograd on:
  forward time / ops, and (forward+backward - forward) / ops.
* ``kernel_launch_s`` = (forward + backward) / (3 * ops): the per-op overhead of a training
  step when the simulator counts a backward as two ops per forward op (docs/design.md section 4:
  backward = 2x forward), so forward + backward overhead sums to what was measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hwprofiles.calibrate.settings import Timing
from hwprofiles.calibrate.timing import seconds_per_call

_TINY = 8  # tiny tensors are 8 x 8: the arithmetic is a few hundred flops, all else is overhead
_BLOCKS = 4
_OPS_PER_BLOCK = 6


@dataclass(frozen=True)
class Overhead:
    dispatch_s: float
    forward_op_s: float
    backward_op_s: float
    kernel_launch_s: float


def _tiny_ops(device: str) -> dict[str, Callable[[], object]]:
    a = torch.randn(_TINY, _TINY, device=device)
    b = torch.randn(_TINY, _TINY, device=device)
    w = torch.ones(_TINY, device=device)
    return {
        "add": lambda: a + b,
        "mul": lambda: a * 1.5,
        "mm": lambda: a @ b,
        "gelu": lambda: F.gelu(a),
        "softmax": lambda: F.softmax(a, -1),
        "layer_norm": lambda: F.layer_norm(a, (_TINY,), w, w),
    }


def _layer_chain(device: str) -> tuple[Callable[[], torch.Tensor], int]:
    """A forward of ``_BLOCKS`` tiny transformer-like blocks; returns (fn, number of forward ops)."""
    x = torch.randn(_TINY, _TINY, device=device, requires_grad=True)
    w1 = torch.randn(_TINY, _TINY, device=device, requires_grad=True)
    w2 = torch.randn(_TINY, _TINY, device=device, requires_grad=True)
    bias = torch.zeros(_TINY, device=device, requires_grad=True)
    g = torch.ones(_TINY, device=device, requires_grad=True)

    def forward() -> torch.Tensor:
        y = x
        for _ in range(_BLOCKS):
            h = F.layer_norm(y, (_TINY,), g, bias)
            h = F.linear(h, w1, bias)
            h = F.gelu(h, approximate="tanh")
            h = F.linear(h, w2, bias)
            y = y + h
            y = F.softmax(y, -1)
        return y.sum()

    return forward, _BLOCKS * _OPS_PER_BLOCK + 1


def measure_overhead(device: str, timing: Timing, passes: int, tick: Callable[[str], None]) -> Overhead:
    """Time tiny ops without and with autograd (see the module docstring for the definitions);
    each time is the best of ``passes`` measurements."""
    ops = _tiny_ops(device)
    times = {name: min(seconds_per_call(fn, device, timing) for _ in range(passes)) for name, fn in ops.items()}
    tick("per-op dispatch")
    forward, n_ops = _layer_chain(device)
    t_fwd = min(seconds_per_call(forward, device, timing) for _ in range(passes))
    t_fb = min(seconds_per_call(lambda: forward().backward(), device, timing) for _ in range(passes))
    tick("autograd per-op overhead")
    t_bwd = max(t_fb - t_fwd, 0.0)
    return Overhead(
        dispatch_s=statistics.median(times.values()),
        forward_op_s=t_fwd / n_ops,
        backward_op_s=t_bwd / n_ops,
        kernel_launch_s=t_fb / (3 * n_ops),
    )
