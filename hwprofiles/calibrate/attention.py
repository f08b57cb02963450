"""Causal fused attention for ``autoplan calibrate`` (the profile's ``attention`` section).

Each (batch, heads, seq, head_dim) shape of ``settings.attention_shapes`` runs causal
``F.scaled_dot_product_attention`` (the runtime's attention; FlashAttention or cuDNN on a GPU)
forward, and forward plus backward with a fixed output gradient. FLOPs are counted as the
kernel executes them (:func:`causal_attention_flops`): a causal kernel skips the blocks above
the diagonal, so counting the full s x s matrix, as the first calibrations did, reported
838-1221 TFLOP/s on an H100 whose bf16 peak is 989 (shared/gpu/h100-2026-11-26). The backward
is the forward-and-backward time less the forward time, on 2.5x the forward's FLOPs (it
recomputes the scores: FlashAttention-2, section 4.1, as ``simulator.cost.ops.backward_ops``
prices it). Work time as the GEMMs': device time on a GPU, the host's launch hidden; on a CPU
the thread's time less that of the same op on a one-token tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from hwprofiles.calibrate.settings import Settings
from hwprofiles.calibrate.timing import TORCH_DTYPES, raw_seconds, seconds_per_call, work_seconds
from hwprofiles.schema import AttentionPoint

#: backward FLOPs over forward FLOPs of fused attention (FlashAttention-2, section 4.1: 5 GEMMs to 2)
BACKWARD_FLOP_RATIO = 2.5


def causal_attention_flops(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """Forward FLOPs a causal fused attention executes: QK^T and PV are 2*s*s*d multiply-adds
    each per head, 4*b*h*s^2*d FLOPs over the full matrix, of which a causal kernel runs the
    half on and below the diagonal: 2*b*h*s^2*d (FlashAttention-2, section 3.1, counts it so).
    E.g. b=1, h=32, s=2048, d=128: 2 * 32 * 2048^2 * 128 = 3.436e10."""
    return 2.0 * batch * heads * seq * seq * head_dim


def _tensors(b: int, a: int, s: int, d: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(b, a, s, d, device=device).to(dtype).requires_grad_() for _ in range(3))


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


def _forward_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], object]:
    grad = torch.ones_like(q)

    def run() -> object:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
        return out

    return run


def _dispatch_seconds(head_dim: int, settings: Settings, dtype: torch.dtype) -> tuple[float, float]:
    """CPU: (forward, forward+backward) time of a one-token attention, the per-call overhead
    subtracted from the measurements; CUDA: (0, 0), the device time has none."""
    if settings.device != "cpu":
        return 0.0, 0.0
    q, k, v = _tensors(1, 1, 1, head_dim, settings.device, dtype)
    return (
        seconds_per_call(_forward(q, k, v), settings.device, settings.timing),
        seconds_per_call(_forward_backward(q, k, v), settings.device, settings.timing),
    )


def measure_attention(settings: Settings, dtype: str, tick: Callable[[str], None]) -> list[AttentionPoint]:
    """One :class:`AttentionPoint` per shape of the settings (module docstring)."""
    tdt = TORCH_DTYPES[dtype]
    points = []
    for b, a, s, d in settings.attention_shapes:
        base_f, base_fb = _dispatch_seconds(d, settings, tdt)
        q, k, v = _tensors(b, a, s, d, settings.device, tdt)
        fwd = work_seconds(raw_seconds(_forward(q, k, v), settings.device, settings.timing), base_f, settings.device)
        both = work_seconds(
            raw_seconds(_forward_backward(q, k, v), settings.device, settings.timing), base_fb, settings.device
        )
        flops = causal_attention_flops(b, a, s, d)
        bwd = max(both - fwd, 1e-9)
        points.append(
            AttentionPoint(
                seq=s,
                head_dim=d,
                forward_tflops=flops / fwd / 1e12,
                backward_tflops=BACKWARD_FLOP_RATIO * flops / bwd / 1e12,
            )
        )
        tick(f"attention b{b} a{a} s{s} d{d}")
    return points
