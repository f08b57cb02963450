"""GEMM throughput over a grid of shapes for ``autoplan calibrate``.

C[m, n] = A[m, k] @ B[k, n] (``torch.mm``, what ``nn.Linear`` and its backward run; fp8:
``torch._scaled_mm`` of e4m3 operands with one scale per tensor and a bf16 output, the GEMM
of Transformer Engine's delayed-scaling recipe, which runs on GPUs of compute capability 8.9
and newer);
throughput = 2*m*n*k / t, where t is the op's work time (``calibrate.timing.work_seconds``:
on CPU the time less the dispatch time of a 1x1x1 ``mm``, on CUDA the device time).
The per-op overhead is left out because the simulator adds ``kernel_launch_us`` to every op
(docs/design.md section 4, "Op time").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hwprofiles.calibrate.settings import Settings
from hwprofiles.calibrate.timing import TORCH_DTYPES, raw_seconds, work_seconds
from hwprofiles.schema import GemmPoint

#: fp8 GEMM operands are e4m3 (Transformer Engine's forward format); the dispatch shape is the
#: smallest ``torch._scaled_mm`` accepts (every dimension a multiple of 16)
FP8_DISPATCH_DIM = 16


def fp8_supported() -> bool:
    """Whether this CUDA device runs fp8 GEMMs (compute capability 8.9: Ada, Hopper and newer)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def supported_dtypes(settings: Settings) -> tuple[str, ...]:
    """The settings' dtypes this device runs (bf16 needs Ampere or newer on CUDA, fp8 Ada or
    newer)."""
    unsupported = set()
    if settings.device == "cuda" and not torch.cuda.is_bf16_supported():
        unsupported.add("bf16")
    if settings.device != "cuda" or not fp8_supported():
        unsupported.add("fp8")
    return tuple(d for d in settings.gemm_dtypes if d not in unsupported)


def _scaled_mm(m: int, n: int, k: int, device: str, gen: torch.Generator) -> Callable[[], object]:
    """fp8 C[m,n] = A[m,k] @ B[k,n]: e4m3 operands, per-tensor scales, bf16 output; B column-major
    as ``torch._scaled_mm`` requires (a Linear's weight, stored [n, k], is that already)."""
    a = torch.randn(m, k, device=device, generator=gen).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device, generator=gen).to(torch.float8_e4m3fn).t()
    scale = torch.ones((), device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def matmul_call(m: int, n: int, k: int, dtype: str, device: str, gen: torch.Generator) -> Callable[[], object]:
    """One m x k by k x n product in ``dtype`` on ``device`` (fp8: torch._scaled_mm), as a call to time."""
    if dtype == "fp8":
        return _scaled_mm(m, n, k, device, gen)
    a = torch.randn(m, k, device=device, generator=gen).to(TORCH_DTYPES[dtype])
    b = torch.randn(k, n, device=device, generator=gen).to(TORCH_DTYPES[dtype])
    return lambda: torch.mm(a, b)


def measure_gemm(settings: Settings, tick: Callable[[str], None]) -> list[GemmPoint]:
    """One GemmPoint per (dtype, shape) of the settings' grid, dtype-major, shapes in grid order.

    The grid is swept ``settings.passes`` times and each shape keeps its best time, as does the
    dispatch time (a 1x1x1 ``mm`` of the dtype, timed in every pass), so a burst of other work
    on a shared host spoils one pass of a shape rather than the shape.
    """
    raw: dict[tuple[str, int, int, int], float] = {}
    dispatch: dict[str, float] = {}
    gen = torch.Generator(device=settings.device).manual_seed(0)
    runnable = supported_dtypes(settings)
    for _ in range(settings.passes):
        for dtype in settings.gemm_dtypes:
            if dtype in runnable:
                tiny = FP8_DISPATCH_DIM if dtype == "fp8" else 1
                t = raw_seconds(
                    matmul_call(tiny, tiny, tiny, dtype, settings.device, gen), settings.device, settings.timing
                )
                dispatch[dtype] = min(dispatch.get(dtype, float("inf")), t)
            for m, n, k in settings.gemm_shapes:
                if dtype not in runnable:
                    tick(f"gemm {dtype} unsupported")
                    continue
                t = raw_seconds(matmul_call(m, n, k, dtype, settings.device, gen), settings.device, settings.timing)
                raw[(dtype, m, n, k)] = min(raw.get((dtype, m, n, k), float("inf")), t)
                tick(f"gemm {dtype} {m}x{n}x{k}")
    return [
        GemmPoint(
            m=m,
            n=n,
            k=k,
            dtype=dtype,
            tflops=2.0 * m * n * k / work_seconds(t, dispatch[dtype], settings.device) / 1e12,
        )
        for (dtype, m, n, k), t in raw.items()
    ]


def peak_by_dtype(points: list[GemmPoint]) -> dict[str, GemmPoint]:
    """The fastest measured point of each dtype (the profile's peak_tflops)."""
    best: dict[str, GemmPoint] = {}
    for p in points:
        if p.dtype not in best or p.tflops > best[p.dtype].tflops:
            best[p.dtype] = p
    return best
