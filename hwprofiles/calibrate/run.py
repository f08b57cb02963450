"""Run every ``autoplan calibrate`` benchmark in order and gather a :class:`Calibration`.

Order: per-op overhead, GEMM grid, memory-bound ops and attention, host copies, host Adam,
the eager blocks' host time, then the collectives (and the tensor-parallel layer's host
time) in ``ranks`` spawned processes. One tqdm bar on stderr counts the
benchmarks. CPU benchmarks run with ``torch.set_num_threads(1)`` (one rank per core, as the
CPU verification runs with OMP_NUM_THREADS=1); the caller's thread count is restored after.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from datetime import date

import torch
from tqdm import tqdm

from hwprofiles.algorithms import uses_trees
from hwprofiles.calibrate import host
from hwprofiles.calibrate.attention import measure_attention
from hwprofiles.calibrate.comm import CommResult, comm_items, measure_collectives
from hwprofiles.calibrate.eager import EagerResult, PassHost, measure_eager, median_result
from hwprofiles.calibrate.fit import COLLECTIVES, GemmFit, LinkFit, fit_attention_curve, fit_gemm_curve, fit_link
from hwprofiles.calibrate.gemm import measure_gemm, peak_by_dtype, supported_dtypes
from hwprofiles.calibrate.host import CopyResult
from hwprofiles.calibrate.memory import MemoryResult, measure_memory
from hwprofiles.calibrate.ops import Overhead, measure_overhead
from hwprofiles.calibrate.reference_layers import LayerSplit
from hwprofiles.calibrate.result import Calibration
from hwprofiles.calibrate.settings import settings_for
from hwprofiles.schema import AttentionPoint, GemmPoint


@dataclass(frozen=True)
class _Benchmarks:
    """What the benchmarks measured, before the collective fits."""

    threads: int  # intra-op threads the compute benchmarks ran with
    overhead: Overhead
    points: list[GemmPoint]
    default_dtype: str
    peaks: dict[str, GemmPoint]
    gemm_fit: GemmFit
    memory: MemoryResult
    attention: list[AttentionPoint]
    copies: CopyResult
    host_rates: host.HostRates  # the host Adam step, gradient sum and norm
    eager: EagerResult  # single-process blocks, median of the rounds
    reserved_GiB: float
    reserved_how: str
    comm: CommResult | None  # None: fewer than 2 ranks


def measure(device: str, quick: bool, ranks: int, progress: bool, split_layer: LayerSplit) -> Calibration:
    """All measurements of one calibration (CPU: with one intra-op thread, restored after);
    ``split_layer``: the program's tensor-parallel split of a layer, timed with ``ranks`` >= 2."""
    baseline_rss = host.resident_GiB()
    load_before = host.load_average()
    s = settings_for(device, quick)
    n_comm = comm_items(ranks, len(s.comm_bytes)) if ranks >= 2 else 0
    threads = torch.get_num_threads()
    bar = tqdm(
        total=s.compute_items() + n_comm,
        desc=f"calibrate {device}",
        unit="bench",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )

    def tick(label: str) -> None:
        bar.set_postfix_str(label, refresh=False)
        bar.update(1)

    try:
        if device == "cpu":
            torch.set_num_threads(1)
        used_threads = torch.get_num_threads()
        ovh = measure_overhead(device, s.timing, s.passes, tick)
        eager_rounds = [measure_eager(device, s.eager_repeats, tick)]
        points = measure_gemm(s, tick)
        eager_rounds.append(measure_eager(device, s.eager_repeats, tick))
        dtypes = supported_dtypes(s)
        default_dtype = dtypes[0]
        peaks = peak_by_dtype(points)
        fit = fit_gemm_curve([p for p in points if p.dtype == default_dtype], peaks[default_dtype].tflops)
        mem = measure_memory(s, default_dtype, tick)
        attention = measure_attention(s, default_dtype, tick)
        copies = host.measure_copies(s, tick)
        rates = host.measure_host_rates(s, tick)
        eager_rounds.append(measure_eager(device, s.eager_repeats, tick))
        eager = median_result(eager_rounds)
        reserved, how = _reserved(device, baseline_rss)
        comm = (
            measure_collectives(device, ranks, s.comm_bytes, s.comm_timing, s.eager_repeats, split_layer, tick)
            if ranks >= 2
            else None
        )
    finally:
        torch.set_num_threads(threads)
        bar.close()
    b = _Benchmarks(
        used_threads, ovh, points, default_dtype, peaks, fit, mem, attention, copies, rates, eager, reserved, how, comm
    )
    return _calibration(device, quick, ranks, load_before, b)


def _with_collectives(device: str, b: _Benchmarks) -> tuple[LinkFit | None, dict[str, LinkFit], _Benchmarks]:
    """The link fits (all collectives, and each alone) and the figures the ranks measured: the
    tensor-parallel blocks' host time and, on CPU, a rank's resident memory as the reserve."""
    comm = b.comm
    if comm is None:
        return None, {}, b
    trees = uses_trees(comm.backend)
    link = fit_link(comm.samples, trees)
    by_op = {op: fit_link([x for x in comm.samples if x.op == op], trees) for op in COLLECTIVES}
    if device == "cpu":
        b = dataclasses.replace(
            b,
            reserved_GiB=comm.rank_resident_GiB,
            reserved_how=f"resident memory of a {comm.backend} rank after its collectives",
        )
    r, e = comm.tp_ratios, b.eager
    eager = dataclasses.replace(
        e,
        tp_layer=PassHost(r.forward * e.layer.forward_s, r.backward * e.layer.backward_s),
        tp_optimizer_tensor_s=r.optimizer * e.optimizer_tensor_s,
    )
    return link, by_op, dataclasses.replace(b, eager=eager)


def _calibration(device: str, quick: bool, ranks: int, load_before: float, b: _Benchmarks) -> Calibration:
    """The benchmarks' figures with the collective fits and this host's facts, in profile units."""
    link, by_op, b = _with_collectives(device, b)
    comm, ovh, mem, copies = b.comm, b.overhead, b.memory, b.copies
    return Calibration(
        date=date.today().isoformat(),
        device=device,
        device_name=host.device_name(device),
        torch_version=torch.__version__,
        host=host.host_name(),
        mode="quick" if quick else "full",
        threads=b.threads,
        host_load=f"{load_before:.2f} / {host.load_average():.2f}",
        default_dtype=b.default_dtype,
        peaks=b.peaks,
        gemm_points=b.points,
        gemm_fit=b.gemm_fit,
        gemm_fp8_fit=_fp8_fit(b),
        dispatch_us=ovh.dispatch_s * 1e6,
        forward_op_us=ovh.forward_op_s * 1e6,
        backward_op_us=ovh.backward_op_s * 1e6,
        kernel_launch_us=ovh.kernel_launch_s * 1e6,
        memory_bandwidth_GBps=mem.bandwidth_GBps,
        memory_efficiency=mem.efficiency,
        memory_by_op_GBps=mem.by_op_GBps,
        attention_points=b.attention,
        attention_fit=fit_attention_curve(b.attention, b.peaks[b.default_dtype].tflops) if b.attention else None,
        memory_GiB=host.device_memory_GiB(device, ranks),
        memory_reserved_GiB=b.reserved_GiB,
        reserved_how=b.reserved_how,
        copy_h2d_GBps=copies.h2d_GBps,
        copy_d2h_GBps=copies.d2h_GBps,
        copy_latency_us=copies.latency_us,
        cpu_adam_GBps=b.host_rates.adam_GBps,
        host_sum_GBps=b.host_rates.sum_GBps,
        host_norm_GBps=b.host_rates.norm_GBps,
        host_memory_GiB=host.host_memory_GiB(),
        cpu_cores=host.cpu_cores(),
        compute_slots=comm.compute_slots if comm is not None else None,
        busy_wait_s=comm.busy_wait_s if comm is not None else None,
        sync_wait_s=comm.sync_wait_s if comm is not None else None,
        sync_bus_s_per_byte=comm.sync_bus_s_per_byte if comm is not None else None,
        gpus_per_node=ranks if device == "cpu" else torch.cuda.device_count(),
        intra_kind=_intra_kind(device),
        ranks=ranks,
        backend="nccl" if device == "cuda" else "gloo",
        eager=b.eager,
        link=link,
        link_by_op=by_op,
        collective_samples=comm.samples if comm is not None else [],
    )


def _fp8_fit(b: _Benchmarks) -> GemmFit | None:
    """The fp8 GEMM curve fitted to the fp8 points against the fp8 peak (None without fp8)."""
    fp8 = [p for p in b.points if p.dtype == "fp8"]
    return fit_gemm_curve(fp8, b.peaks["fp8"].tflops) if fp8 else None


def _reserved(device: str, baseline_rss_GiB: float) -> tuple[float, str]:
    """Memory the runtime holds before any tensor of the model (GiB) and how it was measured."""
    if device == "cuda":
        how = "device memory in use outside the caching allocator after the benchmarks"
        return host.cuda_runtime_reserved_GiB(), how
    return baseline_rss_GiB, "resident memory of the calibrating process after importing torch"


def _intra_kind(device: str) -> str:
    if device == "cpu":
        return "loopback"
    return "nvlink" if host.nvlink_present() else "pcie"
