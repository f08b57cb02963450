"""GEMM throughput over a grid of shapes for ``autoplan calibrate``.

C[m, n] = A[m, k] @ B[k, n] (``torch.mm``, what ``nn.Linear`` and its backward run);
throughput = 2*m*n*k / t, where t is the op's work time (``calibrate_timing.op_seconds``:
on CPU the wall time less the dispatch time of a tiny ``mm``, on CUDA the device time).
The per-op overhead is left out because the simulator adds ``kernel_launch_us`` to every op
(DESIGN.md section 4, "Op time").
"""

from __future__ import annotations

from typing import Callable

import torch

from hwprofiles.calibrate_settings import Settings
from hwprofiles.calibrate_timing import TORCH_DTYPES, op_seconds
from hwprofiles.schema import GemmPoint


def supported_dtypes(settings: Settings) -> tuple[str, ...]:
    """The settings' dtypes this device runs (bf16 needs Ampere or newer on CUDA)."""
    if settings.device == "cuda" and not torch.cuda.is_bf16_supported():
        return tuple(d for d in settings.gemm_dtypes if d != "bf16")
    return settings.gemm_dtypes


def measure_gemm(settings: Settings, mm_dispatch_s: float, tick: Callable[[str], None]) -> list[GemmPoint]:
    """One GemmPoint per (dtype, shape) of the settings' grid, dtype-major, shapes in grid order."""
    points: list[GemmPoint] = []
    gen = torch.Generator(device=settings.device).manual_seed(0)
    for dtype in settings.gemm_dtypes:
        if dtype not in supported_dtypes(settings):
            for _ in settings.gemm_shapes:
                tick(f"gemm {dtype} unsupported")
            continue
        tdt = TORCH_DTYPES[dtype]
        for m, n, k in settings.gemm_shapes:
            a = torch.randn(m, k, device=settings.device, generator=gen).to(tdt)
            b = torch.randn(k, n, device=settings.device, generator=gen).to(tdt)
            t = op_seconds(lambda: torch.mm(a, b), settings.device, settings.timing, mm_dispatch_s)
            points.append(GemmPoint(m=m, n=n, k=k, tflops=2.0 * m * n * k / t / 1e12, dtype=dtype))
            tick(f"gemm {dtype} {m}x{n}x{k}")
    return points


def peak_by_dtype(points: list[GemmPoint]) -> dict[str, GemmPoint]:
    """The fastest measured point of each dtype (the profile's peak_tflops)."""
    best: dict[str, GemmPoint] = {}
    for p in points:
        if p.dtype not in best or p.tflops > best[p.dtype].tflops:
            best[p.dtype] = p
    return best
