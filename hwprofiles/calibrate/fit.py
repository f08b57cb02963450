"""Pure fitting functions of ``autoplan calibrate`` (numpy + scipy, no torch).

* :func:`fit_gemm_curve` fits the GEMM efficiency curve of :class:`hwprofiles.schema.GemmModel`
      eff(m, n, k) = max_efficiency * prod_x x / (x + half_dim_x),   x in {m, n, k}
  to measured points, by least squares on log(eff) (every shape weighs the same whatever its
  speed) with ``scipy.optimize.least_squares`` under the schema's bounds.
* :func:`fit_link` fits the alpha-beta (Hockney) ring model of collectives
      t(S) = steps(op, n) * latency + bus_factor(op, n) * S / bandwidth
  to measured collective times, by least squares on the relative error. ``bus_factor`` is
  the ring algorithms' (nccl-tests doc/PERFORMANCE.md "bus bandwidth": all-reduce 2(n-1)/n,
  all-gather and reduce-scatter (n-1)/n, send/recv 1) and ``steps`` the ring's step count or
  a double binary tree's 2*ceil(log2 n) when fewer, the rule simulator.cost.collectives applies;
  so the fitted bandwidth and latency are the bus bandwidth and per-step latency that the
  simulator's collective model reproduces the measurements with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from hwprofiles.algorithms import latency_steps
from hwprofiles.schema import AttentionPoint, GemmPoint
from hwprofiles.units import GB

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


@dataclass(frozen=True)
class AttentionFit:
    """The fields of :class:`hwprofiles.schema.AttentionModel`'s curve and the fit's quality."""

    forward_efficiency: float
    backward_efficiency: float
    half_seq: float
    rms_log_error: float  # over the forward and backward points together


def fit_attention_curve(points: Sequence[AttentionPoint], peak_tflops: float) -> AttentionFit:
    """Least-squares fit (on log efficiency) of eff(s) = top * s / (s + half_seq), one ``top``
    each for forward and backward and one shared ``half_seq``, to measured points (efficiency =
    tflops / peak). For a given half_seq the best log-space top is the mean of
    log(eff) - log(s / (s + half_seq)); half_seq is searched on a log grid from 1 to 2^16 (and
    0). The tops are capped at 1: a measured rate above the peak is an error of the caller."""
    seq = np.array([p.seq for p in points], dtype=float)
    eff = {
        "forward": np.array([p.forward_tflops for p in points]) / peak_tflops,
        "backward": np.array([p.backward_tflops for p in points]) / peak_tflops,
    }
    best: tuple[float, float, float, float] | None = None
    for half in (0.0, *np.geomspace(1.0, 65536.0, 161)):
        shape = np.log(seq / (seq + half))
        tops = {k: float(np.mean(np.log(e) - shape)) for k, e in eff.items()}
        res = np.concatenate([np.log(e) - shape - tops[k] for k, e in eff.items()])
        rms = float(np.sqrt(np.mean(res**2)))
        if best is None or rms < best[3]:
            best = (min(1.0, float(np.exp(tops["forward"]))), min(1.0, float(np.exp(tops["backward"]))), half, rms)
    assert best is not None, "no attention points"
    return AttentionFit(*best)


@dataclass(frozen=True)
class GemmFit:
    """Fitted curve parameters (the fields of GemmModel) and the fit's quality."""

    max_efficiency: float
    half_dim_m: float
    half_dim_n: float
    half_dim_k: float
    rms_log_error: float  # root mean square of log(model / measured) over the points

    def efficiency(self, m: float, n: float, k: float) -> float:
        return float(gemm_curve(np.array([m, n, k], dtype=float)[None, :], self.params())[0])

    def params(self) -> np.ndarray:
        return np.array([self.max_efficiency, self.half_dim_m, self.half_dim_n, self.half_dim_k])


def gemm_curve(mnk: np.ndarray, params: np.ndarray) -> np.ndarray:
    """eff = E * prod_x x / (x + h_x) for rows (m, n, k) of ``mnk``; params = (E, h_m, h_n, h_k)."""
    e, h = params[0], np.asarray(params[1:4], dtype=float)
    return e * np.prod(mnk / (mnk + h[None, :]), axis=1)


def fit_gemm_curve(points: Sequence[GemmPoint], peak_tflops: float) -> GemmFit:
    """Least-squares fit of the GemmModel curve to ``points`` (efficiency = tflops / peak).

    Bounds follow the schema: 0 < max_efficiency <= 1, half dims >= 0 (capped at 1e6); a half
    dim that lands within 1e-6 of its zero bound is reported as 0 (no dependence on that dim).
    """
    if not points:
        raise ValueError("no GEMM points to fit")
    if not peak_tflops > 0:
        raise ValueError(f"peak_tflops must be positive, got {peak_tflops!r}")
    mnk = np.array([[p.m, p.n, p.k] for p in points], dtype=float)
    eff = np.array([p.tflops for p in points], dtype=float) / peak_tflops
    log_eff = np.log(eff)

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(gemm_curve(mnk, x)) - log_eff

    x0 = np.array([min(1.0, float(eff.max())), 32.0, 32.0, 32.0])
    lower = np.array([1e-6, 0.0, 0.0, 0.0])
    upper = np.array([1.0, 1e6, 1e6, 1e6])
    sol = least_squares(
        residual,
        x0,
        bounds=(lower, upper),
        x_scale=np.array([0.1, 32.0, 32.0, 32.0]),
        xtol=1e-12,
        ftol=1e-12,
        gtol=1e-12,
        max_nfev=2000,
    )
    e, hm, hn, hk = (float(v) if v >= 1e-6 else 0.0 for v in sol.x)
    rms = float(np.sqrt(np.mean(residual(np.array([e, hm, hn, hk])) ** 2)))
    return GemmFit(max_efficiency=e, half_dim_m=hm, half_dim_n=hn, half_dim_k=hk, rms_log_error=rms)


def ring_steps(op: str, ranks: int, trees: bool = True) -> int:
    """Latency terms of a collective over ``ranks`` ranks (hwprofiles.algorithms.latency_steps):
    the ring's steps (all-reduce 2(n-1), all-gather/reduce-scatter n-1), or for an NCCL
    all-reduce 2*ceil(log2 n) when fewer; send/recv one hop."""
    return latency_steps(ranks, op, trees)


def bus_factor(op: str, ranks: int) -> float:
    """Bus bytes per message byte (nccl-tests PERFORMANCE.md): busbw = algbw * factor."""
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


@dataclass(frozen=True)
class CollectiveSample:
    """Mean time of one collective of ``nbytes`` (all-reduce: the buffer; all-gather: the
    gathered output; reduce-scatter: the input; send/recv: the message) over ``ranks`` ranks."""

    op: str
    nbytes: int
    ranks: int
    seconds: float


@dataclass(frozen=True)
class LinkFit:
    """Alpha-beta fit: one-hop latency (s), bus bandwidth (bytes/s), rms relative error;
    ``trees``: whether the backend's latency-bound collectives run as trees (NCCL)."""

    latency_s: float
    bandwidth_Bps: float
    rms_rel_error: float
    samples: int
    trees: bool = True

    def predict(self, op: str, nbytes: float, ranks: int) -> float:
        return ring_steps(op, ranks, self.trees) * self.latency_s + bus_factor(op, ranks) * nbytes / self.bandwidth_Bps


def fit_link(samples: Iterable[CollectiveSample], trees: bool = True) -> LinkFit:
    """Fit (latency, bandwidth) of the ring model to ``samples`` by least squares on t_model/t - 1,
    counting latency steps as the backend runs them (``trees``: NCCL; gloo runs rings only).

    Parameterized as (latency in us, seconds per GB) so both are O(1)..O(1e3) for the solver.
    """
    rows = list(samples)
    if not rows:
        raise ValueError("no collective samples to fit")
    if any(s.ranks < 2 for s in rows):
        raise ValueError("a collective sample needs at least 2 ranks")
    steps = np.array([ring_steps(s.op, s.ranks, trees) for s in rows], dtype=float)
    gbytes = np.array([bus_factor(s.op, s.ranks) * s.nbytes / GB for s in rows], dtype=float)
    t = np.array([s.seconds for s in rows], dtype=float)

    def residual(x: np.ndarray) -> np.ndarray:
        return (steps * x[0] * 1e-6 + gbytes * x[1]) / t - 1.0

    # initial guess: latency from the smallest message, bandwidth from the largest
    i_small, i_big = int(np.argmin(gbytes)), int(np.argmax(gbytes))
    lat0 = max(t[i_small] / steps[i_small] * 1e6 * 0.5, 1e-3)
    inv_bw0 = max(t[i_big] / max(gbytes[i_big], 1e-12) * 0.5, 1e-6)
    sol = least_squares(
        residual,
        np.array([lat0, inv_bw0]),
        bounds=([0.0, 1e-9], [np.inf, np.inf]),
        x_scale="jac",
        xtol=1e-12,
        ftol=1e-12,
        gtol=1e-12,
        max_nfev=2000,
    )
    lat_us, s_per_gb = float(sol.x[0]), float(sol.x[1])
    rms = float(np.sqrt(np.mean(residual(sol.x) ** 2)))
    return LinkFit(
        latency_s=lat_us * 1e-6, bandwidth_Bps=GB / s_per_gb, rms_rel_error=rms, samples=len(rows), trees=trees
    )
