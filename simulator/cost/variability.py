"""A synchronous job runs at the pace of its slowest GPU.

GPUs of one SKU do not run equally fast: manufacturing variability under power management gives
same-SKU GPUs of a cluster an average performance variation of 8% (up to 22%), with outliers up
to 1.5x slower than the median GPU (Sinha et al., "Not All GPUs Are Created Equal:
Characterizing Variability in Large-Scale, Accelerator-Rich Systems", SC 2022,
arXiv:2208.11035v3). Data, pipeline and tensor parallelism synchronize every rank every step
(each collective waits for its last member, each pipeline stage for the stage before it), so
the step's compute runs at the slowest GPU's speed. With per-GPU speeds normal around the
median, relative standard deviation ``spread`` (the GPU profile's ``speed_spread``), the slowest
of n GPUs is expected to run at 1 - spread * z(n), where z(n) is the expected largest of n
standard normal samples; the device's work takes 1 / (1 - spread * z(n)) times as long (the
host that issues it is not slowed: simulator.cost.block_times.device_slowdown).

z(n) by Blom's approximation of normal order statistics (Blom 1958, "Statistical Estimates and
Transformed Beta-Variables"): z(n) = Phi^-1((n - 0.375) / (n + 0.25)); z(1) = 0, z(8) = 1.434
(exact 1.424), z(1024) = 3.234 (exact 3.241).
"""

from __future__ import annotations

import functools
from statistics import NormalDist


@functools.lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normal samples] (Blom's approximation; 0 for n = 1)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def slowest_gpu_factor(n_gpus: int, spread: float) -> float:
    """How much longer compute takes at the pace of the slowest of ``n_gpus`` GPUs whose speeds
    have relative standard deviation ``spread``: 1 / (1 - spread * z(n)) (module docstring)."""
    return 1.0 / (1.0 - spread * expected_max_normal(n_gpus))
