"""What interruptions cost a long training job: checkpoint dumps, lost work and restarts.

A job of G GPUs is interrupted as a Poisson process of rate G * lambda (lambda: interruptions
per GPU-hour), so its mean time between interruptions is M = 3600 / (G * lambda) seconds. It
writes a checkpoint (delta seconds) every tau seconds of work and, after an interruption,
spends R seconds before it trains again (detection, relaunch, reading the checkpoint) and
redoes the work since its last checkpoint. Pure functions of numbers; the cluster file's
``reliability`` gives the figures (hwprofiles.schema.cluster.Reliability).
"""

from __future__ import annotations

import math


def job_mtbf_s(failures_per_gpu_hour: float, gpus: int) -> float:
    """Mean seconds between interruptions of a job of ``gpus`` GPUs: M = 3600 / (gpus * lambda)."""
    return 3600.0 / (failures_per_gpu_hour * gpus)


def checkpoint_seconds(checkpoint_bytes: float, gpus: int, GBps_per_gpu: float) -> float:
    """Seconds to write (or read) a checkpoint of ``checkpoint_bytes`` when every GPU's rank writes
    its share at ``GBps_per_gpu`` of the storage's bandwidth: bytes / (gpus * GBps * 1e9)."""
    return checkpoint_bytes / (gpus * GBps_per_gpu * 1e9)


def daly_interval_s(dump_s: float, mtbf_s: float) -> float:
    """Work seconds between checkpoints that minimize the expected wall time, Daly's higher-order
    estimate (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
    dumps", Future Generation Computer Systems 22(3), 2006):

        tau = sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta   for delta < 2M
        tau = M                                                                          otherwise

    Its first term is Young's sqrt(2 delta M) (Young 1974)."""
    if dump_s >= 2 * mtbf_s:
        return mtbf_s
    x = dump_s / (2 * mtbf_s)
    return math.sqrt(2 * dump_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - dump_s


def expected_wall_factor(interval_s: float, dump_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall seconds per second of work for exponentially distributed interruptions (the
    complete model of Daly 2006: T_wall = M e^(R/M) (e^((tau + delta)/M) - 1) T_work / tau):

        F = M * exp(R / M) * (exp((tau + delta) / M) - 1) / tau

    Without interruptions (M -> infinity) F -> (tau + delta) / tau, the dumps alone."""
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + dump_s) / mtbf_s) / interval_s
