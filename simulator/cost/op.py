"""One op of a layer's work: its FLOPs, HBM traffic, GEMM shape and kernel counts
(simulator.cost.workload lists them, simulator.cost.ops times them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OpKind = Literal["gemm", "bmm", "attention", "elementwise"]

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Op:
    """One op of the forward pass. ``count`` identical instances (batched GEMMs) run as one
    kernel. ``kernels``: kernel launches of the forward op (a fused elementwise op may take a
    few); ``bwd_kernels`` / ``bwd_bytes``: launches and HBM traffic of an elementwise op's
    backward (a negative ``bwd_bytes`` means twice the forward traffic; GEMM backwards are
    always their dgrad and wgrad GEMMs, see simulator.cost.ops.backward_ops). ``dtype``: the
    dtype a GEMM computes in when it is not the GPU profile's default (fp8 linear layers,
    simulator.cost.precision)."""

    name: str
    kind: OpKind
    flops: float
    bytes: float
    m: int = 0
    n: int = 0
    k: int = 0
    count: int = 1
    kernels: int = 1
    bwd_kernels: int = 1
    bwd_bytes: float = -1.0
    dtype: str | None = None


def gemm(name: str, m: int, n: int, k: int, e: int, count: int = 1, dtype: str | None = None) -> Op:
    """C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs; reads A and B, writes C (e bytes per element);
    ``dtype``: computed in that dtype instead of the GPU's default."""
    return Op(
        name,
        "gemm" if count == 1 else "bmm",
        2.0 * m * n * k * count,
        float(e * (m * k + k * n + m * n) * count),
        m,
        n,
        k,
        count,
        dtype=dtype,
    )


def elementwise(
    name: str,
    elements: float,
    bytes_per_element: float,
    flops_per_element: float = 1.0,
    kernels: int = 1,
    bwd_kernels: int = 1,
    bwd_bytes_per_element: float | None = None,
) -> Op:
    """A memory-bound op touching ``elements`` values with ``bytes_per_element`` of traffic each
    (backward: ``bwd_bytes_per_element``, default twice the forward's)."""
    bwd = -1.0 if bwd_bytes_per_element is None else bwd_bytes_per_element * elements
    return Op(
        name,
        "elementwise",
        flops_per_element * elements,
        bytes_per_element * elements,
        kernels=kernels,
        bwd_kernels=bwd_kernels,
        bwd_bytes=bwd,
    )
