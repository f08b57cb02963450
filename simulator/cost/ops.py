"""Time of one op on one GPU: a roofline with shape-dependent GEMM efficiency.

    work(op) = max(FLOPs / (peak * eff(m, n, k)), bytes / (HBM bandwidth * memory_efficiency))
(Williams et al. 2009, "Roofline"). ``eff`` comes from the profile's measured GEMM table
when it has one (``autoplan calibrate``), else from its saturating curve.

Elementwise ops of a kind the profile measured (``elementwise_GBps``: layer norms, softmax,
GELU/SwiGLU) run at that bandwidth instead of ``memory_bandwidth_GBps * memory_efficiency``.

One op alone with its host's overhead (:func:`op_time`): on a synchronous rank (a CPU computes
its own ops: the gloo/localhost-cpu case) work(op) + kernel_launch_us, per op of the simulator's
op lists (the unit ``autoplan calibrate`` measures it in); on a GPU, whose host enqueues kernels
while earlier ones run, max(work(op), L(op)) with L(op) = kernel_launch_us * op.kernels, the
host's time to issue the op's kernels. A whole pass of ops: simulator.cost.pass_time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hwprofiles.schema import GemmCurve, GpuProfile
from simulator.cost.op import DTYPE_BYTES, Op


def curve_efficiency(gpu: GpuProfile, m: float, n: float, k: float, dtype: str | None = None) -> float:
    """eff = max_efficiency * prod_x x / (x + half_dim_x) over x in (m, n, k), of the fp8 curve
    (``gemm.fp8``) for fp8 GEMMs, else of the profile's own."""
    g: GemmCurve = gpu.gemm.fp8 if dtype == "fp8" and gpu.gemm.fp8 is not None else gpu.gemm
    return g.max_efficiency * (m / (m + g.half_dim_m)) * (n / (n + g.half_dim_n)) * (k / (k + g.half_dim_k))


@dataclass(frozen=True)
class GemmGrid:
    """A measured GEMM table that covers every (m, n, k) of its axes (``autoplan calibrate``'s
    grids do): log2 of each axis's sorted sizes and log(efficiency) at every corner."""

    axes: tuple[np.ndarray, np.ndarray, np.ndarray]
    log_eff: np.ndarray  # [len(m), len(n), len(k)]


_GRIDS: dict[tuple[int, str], tuple[object, GemmGrid | None]] = {}


def gemm_grid(gpu: GpuProfile, dtype: str) -> GemmGrid | None:
    """The table's points of ``dtype`` as a full grid, or None when some corner of the grid
    its sizes span was not measured (a hand-written table). Cached per table object."""
    key = (id(gpu.gemm), dtype)
    hit = _GRIDS.get(key)
    if hit is not None and hit[0] is gpu.gemm:
        return hit[1]
    points = [pt for pt in gpu.gemm.table if pt.dtype == dtype]
    peak = gpu.peak_tflops.get(dtype) or gpu.peak_tflops[gpu.default_dtype]
    sizes = [sorted({getattr(pt, a) for pt in points}) for a in "mnk"]
    grid: GemmGrid | None = None
    if points and len(points) == len(sizes[0]) * len(sizes[1]) * len(sizes[2]):
        log_eff = np.full([len(x) for x in sizes], np.nan)
        for pt in points:
            log_eff[sizes[0].index(pt.m), sizes[1].index(pt.n), sizes[2].index(pt.k)] = math.log(pt.tflops / peak)
        if not np.isnan(log_eff).any():
            axes = (np.log2(sizes[0]), np.log2(sizes[1]), np.log2(sizes[2]))
            grid = GemmGrid(axes, log_eff)
    _GRIDS[key] = (gpu.gemm, grid)
    return grid


def _bracket(axis: np.ndarray, x: float) -> tuple[int, int, float]:
    """Indices of the two grid values around ``x`` (inside the axis) and x's weight on the upper."""
    if len(axis) == 1:
        return 0, 0, 0.0
    hi = int(np.clip(np.searchsorted(axis, x), 1, len(axis) - 1))
    lo = hi - 1
    return lo, hi, float((x - axis[lo]) / (axis[hi] - axis[lo]))


def grid_efficiency(gpu: GpuProfile, grid: GemmGrid, m: float, n: float, k: float, dtype: str) -> float:
    """Trilinear interpolation of log(efficiency) in log2(m), log2(n), log2(k) between the eight
    measured shapes around (m, n, k): exact at a measured shape, a power law between two. Outside
    the grid along an axis the shape is clamped to the grid's edge and the curve's shape
    dependence carries the edge's efficiency out: eff = eff(edge) * curve(q) / curve(edge)."""
    q = (math.log2(m), math.log2(n), math.log2(k))
    edge = [float(np.clip(x, a[0], a[-1])) for x, a in zip(q, grid.axes)]
    (i0, i1, wi), (j0, j1, wj), (k0, k1, wk) = (_bracket(a, x) for a, x in zip(grid.axes, edge))
    e = grid.log_eff
    log_eff = 0.0
    for i, fi in ((i0, 1 - wi), (i1, wi)):
        for j, fj in ((j0, 1 - wj), (j1, wj)):
            for kk, fk in ((k0, 1 - wk), (k1, wk)):
                log_eff += fi * fj * fk * e[i, j, kk]
    eff = math.exp(log_eff)
    if edge != list(q):
        clamped = (2.0 ** edge[0], 2.0 ** edge[1], 2.0 ** edge[2])
        eff *= curve_efficiency(gpu, m, n, k, dtype) / curve_efficiency(gpu, *clamped, dtype)
    return min(eff, 1.0)


def table_efficiency(gpu: GpuProfile, m: float, n: float, k: float, dtype: str) -> float | None:
    """Efficiency from the measured table of ``dtype``: :func:`grid_efficiency` when the table is
    a full grid; else (a hand-written table of scattered shapes) inverse-distance-weighted
    interpolation in log2 shape space over the 4 nearest measured shapes (exact at a measured
    shape), each carried to the query shape by the curve's shape dependence."""
    grid = gemm_grid(gpu, dtype)  # cached: the table's points are read once
    if grid is not None:
        return grid_efficiency(gpu, grid, m, n, k, dtype)
    points = [pt for pt in gpu.gemm.table if pt.dtype == dtype]
    if not points:
        return None
    peak = gpu.peak_tflops.get(dtype) or gpu.peak_tflops[gpu.default_dtype]
    q = (math.log2(m), math.log2(n), math.log2(k))
    scored = []
    for pt in points:
        d2 = (math.log2(pt.m) - q[0]) ** 2 + (math.log2(pt.n) - q[1]) ** 2 + (math.log2(pt.k) - q[2]) ** 2
        eff = pt.tflops / peak
        # carry the point to the query shape with the curve's relative shape dependence
        eff *= curve_efficiency(gpu, m, n, k, dtype) / curve_efficiency(gpu, pt.m, pt.n, pt.k, dtype)
        if d2 == 0.0:
            return min(eff, 1.0)
        scored.append((d2, eff))
    scored.sort(key=lambda x: x[0])
    near = scored[:4]
    wsum = sum(1.0 / d for d, _ in near)
    return min(sum(e / d for d, e in near) / wsum, 1.0)


def gemm_efficiency(gpu: GpuProfile, m: float, n: float, k: float, dtype: str | None = None) -> float:
    dtype = dtype or gpu.default_dtype
    m, n, k = max(m, 1.0), max(n, 1.0), max(k, 1.0)
    measured = table_efficiency(gpu, m, n, k, dtype) if gpu.gemm.table else None
    return measured if measured is not None else curve_efficiency(gpu, m, n, k, dtype)


def attention_table_efficiency(
    gpu: GpuProfile, seq: float, head_dim: float, backward: bool, dtype: str | None = None
) -> float | None:
    """Efficiency of fused attention from the profile's measured points (``attention.table``,
    TFLOP/s on the FLOPs executed): those of the measured head dim nearest ``head_dim`` (in
    log2), log(TFLOP/s) interpolated linearly in log2(seq) between the two around ``seq``;
    outside their range the nearest point carried by the curve's s / (s + half_seq). Over the
    peak of ``dtype`` (as work_time divides by it). None without a table."""
    att = gpu.attention
    if att is None or not att.table:
        return None
    near = min({p.head_dim for p in att.table}, key=lambda d: abs(math.log2(d) - math.log2(max(head_dim, 1.0))))
    pts = sorted((p for p in att.table if p.head_dim == near), key=lambda p: p.seq)
    rates = [p.backward_tflops if backward else p.forward_tflops for p in pts]
    x = min(max(seq, pts[0].seq), pts[-1].seq)
    hi = next((i for i, p in enumerate(pts) if p.seq >= x), len(pts) - 1)
    lo = max(hi - 1, 0)
    if hi == lo or pts[hi].seq == pts[lo].seq:
        rate = rates[hi]
    else:
        w = (math.log2(x) - math.log2(pts[lo].seq)) / (math.log2(pts[hi].seq) - math.log2(pts[lo].seq))
        rate = math.exp((1 - w) * math.log(rates[lo]) + w * math.log(rates[hi]))
    if x != seq:
        rate *= (seq / (seq + att.half_seq)) / (x / (x + att.half_seq))
    return min(rate * 1e12 / gpu.peak_flops(dtype), 1.0)


def attention_efficiency(gpu: GpuProfile, op: Op, dtype: str | None = None) -> float:
    """Efficiency of a fused attention op (``op.m`` = sequence length, ``op.k`` = head dim): the
    profile's measured points when it has them (:func:`attention_table_efficiency`), else its
    :class:`~hwprofiles.schema.gpu.AttentionModel` curve, forward or backward; without either,
    the GEMM efficiency of its score GEMM's shape (s, s, head_dim)."""
    backward = op.name.endswith("_bwd")
    measured = attention_table_efficiency(gpu, op.m, op.k, backward, dtype)
    if measured is not None:
        return measured
    if gpu.attention is not None:
        return gpu.attention.efficiency(op.m, backward)
    return gemm_efficiency(gpu, op.m, op.n, op.k, dtype)


#: simulator elementwise op (forward name) -> the measured kind of ``GpuProfile.elementwise_GBps``
ELEMENTWISE_KIND = {
    "ln1": "layer_norm",
    "ln2": "layer_norm",
    "final_norm": "layer_norm",
    "softmax": "softmax",
    "gelu": "gelu",
    "swiglu": "gelu",
}


def elementwise_bandwidth(op: Op, gpu: GpuProfile) -> float:
    """Bytes/s an elementwise op achieves: its kind's measured bandwidth, else the profile's
    typical one (memory_bandwidth_GBps * memory_efficiency)."""
    kind = ELEMENTWISE_KIND.get(op.name.removesuffix("_bwd"))
    measured = gpu.elementwise_GBps.get(kind) if kind else None
    return measured * 1e9 if measured else gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_efficiency


def work_time(op: Op, gpu: GpuProfile, dtype: str | None = None) -> float:
    """Roofline device time of one op, no launch overhead (all ``count`` instances batched), in
    the op's own dtype (an fp8 GEMM) or ``dtype``, default the profile's."""
    dtype = op.dtype or dtype or gpu.default_dtype
    if op.kind == "elementwise" and gpu.elementwise_GBps:
        mem = op.bytes / elementwise_bandwidth(op, gpu)
    else:
        mem = op.bytes / (gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_efficiency)
    if op.kind == "elementwise":
        comp = op.flops / (gpu.peak_tflops.get("fp32", gpu.peak_flops(dtype) / 1e12) * 1e12)
    elif op.kind == "attention":
        comp = op.flops / (gpu.peak_flops(dtype) * attention_efficiency(gpu, op, dtype))
    else:
        comp = op.flops / (gpu.peak_flops(dtype) * gemm_efficiency(gpu, op.m, op.n, op.k, dtype))
    return max(comp, mem)


def op_time(op: Op, gpu: GpuProfile, dtype: str | None = None, host_async: bool = False) -> float:
    """Time of one op alone: its roofline work plus the per-op overhead ``kernel_launch_us``
    (synchronous), or overlapped with the host's issue time ``kernel_launch_us * op.kernels``
    (``host_async``, a GPU); see the module docstring."""
    work = work_time(op, gpu, dtype)
    if host_async:
        return max(work, gpu.kernel_launch_us * 1e-6 * op.kernels)
    return work + gpu.kernel_launch_us * 1e-6


def backward_ops(op: Op) -> list[Op]:
    """Backward of an op. GEMM C=AB: dA = dC B^T (m,k,n) and dB = A^T dC (k,n,m), 2x FLOPs.
    Fused attention: one kernel of 2.5x the forward FLOPs (it recomputes the scores;
    FlashAttention-2, section 4.1) reading Q, K, V, O, dO and writing dQ, dK, dV (about twice
    the forward traffic). An fp8 GEMM's dgrad and wgrad are fp8 too (Transformer Engine's
    hybrid recipe: e4m3 forward, e5m2 gradients). Elementwise: the op's own backward traffic and kernel count when it gives them
    (``bwd_bytes``, ``bwd_kernels``), else about twice the forward traffic (the gradient
    reads the saved input and the upstream gradient and writes one gradient per input)."""
    if op.kind == "elementwise":
        bwd_bytes = op.bwd_bytes if op.bwd_bytes >= 0 else 2 * op.bytes
        return [Op(op.name + "_bwd", "elementwise", 2 * op.flops, bwd_bytes, kernels=op.bwd_kernels)]
    if op.kind == "attention":
        return [
            Op(
                op.name + "_bwd",
                "attention",
                2.5 * op.flops,
                2 * op.bytes,
                op.m,
                op.n,
                op.k,
                op.count,
                op.bwd_kernels,
                op.bwd_kernels,
            )
        ]
    e = op.bytes / (op.count * (op.m * op.k + op.k * op.n + op.m * op.n))
    dgrad = Op(op.name + "_dgrad", op.kind, op.flops, op.bytes, op.m, op.k, op.n, op.count, dtype=op.dtype)
    wgrad = Op(
        op.name + "_wgrad",
        op.kind,
        op.flops,
        e * op.count * (op.k * op.m + op.m * op.n + op.k * op.n),
        op.k,
        op.n,
        op.m,
        op.count,
        dtype=op.dtype,
    )
    return [dgrad, wgrad]


def dtype_bytes(gpu: GpuProfile) -> int:
    """Bytes per activation element in the profile's training dtype (fp16/bf16: 2, fp32: 4)."""
    return DTYPE_BYTES.get(gpu.default_dtype, 2)
