"""How fast this CPU host runs now against the profile it was calibrated into: ``autoplan run``'s
host speed check on a CPU (autoplan/verify.py).

A shared VM's speed drifts with its neighbours: on the 2-core VM that calibrated the built-in
``cpu`` profile (2026-11-27), a quick calibration one hour later measured the fastest fp32 GEMM
at 0.088 TFLOP/s against 0.144 and the eager layer's forward at 729 us against 410, and the CPU
plans of the tiny model ran 50-100% slower than an hour before. No profile predicts that host
within 20%, so a CPU run measures, next to the plan, two of the profile's figures again, the
same way ``autoplan calibrate`` measured them, on one thread:

* the fastest GEMM of the profile's table, at that shape (``hwprofiles.calibrate.gemm``: best
  time per call less a 1x1x1 ``mm``'s dispatch, TFLOP/s = 2mnk / work time): the arithmetic;
* the eager GPT layer's forward + backward host time (``hwprofiles.calibrate.eager.layer_host``,
  the per-layer slope at negligible arithmetic): the host's per-op work, which also drives
  gloo's collectives over loopback.

Its speed factor is the geometric mean of the two ratios (now over the profile, > 1 faster):
the whole predicted step divided by it is the prediction at the host's speed now, as if its
clock had changed. The speed moves within minutes too (0.48 to 1.03 of the profile's between
runs a minute apart, benchmarks/data/cpu-zero-matrix-2026-11-27c.txt), so ``autoplan run``
measures it before and after the run and takes the mean of the two (:meth:`HostSpeed.mean`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hwprofiles.calibrate.eager import layer_host
from hwprofiles.calibrate.gemm import matmul_call
from hwprofiles.calibrate.settings import settings_for
from hwprofiles.calibrate.timing import raw_seconds, work_seconds
from hwprofiles.schema import GpuProfile

#: repeats of the eager layer's timed loops (calibrate's quick mode)
LAYER_REPEATS = 3


@dataclass(frozen=True)
class HostSpeed:
    """This host's GEMM rate and eager layer time now, beside its profile's."""

    gemm_tflops: float
    profile_gemm_tflops: float
    layer_us: float  # forward + backward
    profile_layer_us: float

    @staticmethod
    def mean(samples: list[HostSpeed]) -> HostSpeed:
        """The mean GEMM rate and eager layer time of ``samples`` (measured against one profile)."""
        n = len(samples)
        return HostSpeed(
            gemm_tflops=sum(s.gemm_tflops for s in samples) / n,
            profile_gemm_tflops=samples[0].profile_gemm_tflops,
            layer_us=sum(s.layer_us for s in samples) / n,
            profile_layer_us=samples[0].profile_layer_us,
        )

    @property
    def factor(self) -> float:
        """The host's speed now over its profile's: sqrt(GEMM ratio x eager-layer ratio)."""
        return math.sqrt((self.gemm_tflops / self.profile_gemm_tflops) * (self.profile_layer_us / self.layer_us))


def host_speed(gpu: GpuProfile) -> HostSpeed | None:
    """Measure this host's :class:`HostSpeed` against ``gpu`` (a CPU profile written by
    ``autoplan calibrate``); None where the profile holds no GEMM table or eager figures."""
    eager, table = gpu.eager, gpu.gemm.table
    if eager is None or not table:
        return None
    best = max(table, key=lambda p: p.tflops)
    timing = settings_for("cpu", quick=True).timing
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core, as calibrate measured the profile
    try:
        gen = torch.Generator().manual_seed(0)
        dispatch = raw_seconds(matmul_call(1, 1, 1, best.dtype, "cpu", gen), "cpu", timing)
        raw = raw_seconds(matmul_call(best.m, best.n, best.k, best.dtype, "cpu", gen), "cpu", timing)
        tflops = 2.0 * best.m * best.n * best.k / work_seconds(raw, dispatch, "cpu") / 1e12
        layer = layer_host("cpu", LAYER_REPEATS)
    finally:
        torch.set_num_threads(threads)
    return HostSpeed(
        gemm_tflops=tflops,
        profile_gemm_tflops=best.tflops,
        layer_us=(layer.forward_s + layer.backward_s) * 1e6,
        profile_layer_us=eager.layer_forward_us + eager.layer_backward_us,
    )
