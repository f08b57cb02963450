"""The layer partition's optimum under memory limits, in closed form, for one chunk per device
(autoplan.partition; pipelines that interleave chunks go to CP-SAT).

Device i holding N layers, F of them fully and S selectively recomputed, takes
    g_i(N) = N * P + x_i + min { F * R_full + S * R_sel : F + S <= N, its memory rows hold }
per microbatch (x_i: the embedding's and the head's time where it holds them; the memory rows:
autoplan.partition._device_memory, linear in N, F, S plus a constant where F > 0). Where the
recomputation is pinned (every layer fully or selectively), F or S is N. The partition model's
objective is (m - 1) * M + sum_i g_i(N_i) with M = max_i g_i(N_i) and sum_i N_i = L
(autoplan.pipeline_balance.pipeline_objective). g_i grows with N (each layer adds its time, and
where N + 1 layers fit with some recomputation, N fit with no more). Under a cap M on every device,
the least sum S(M) = min sum_i g_i(N_i) over 1 <= N_i with g_i(N_i) <= M and sum_i N_i = L is a
dynamic program over the devices in turn and the layers placed so far. The optimum is the least
(m - 1) * M + S(M) over the caps M at which some device can take one more layer, scanned upward
from the least feasible cap until (m - 1) * M + L * P + sum_i x_i, a bound below every larger
cap's, is no better. Where the memory rows do not grow with the layers, where some device cannot
hold one layer, or where the scan runs past :data:`MAX_CAPS`, there is no answer here (None) and
CP-SAT solves the model (tests/test_pipeline_memory.py: the least objective by enumeration of
every split and recomputation of small cases, and never worse than CP-SAT on gpt-1t's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from autoplan.pipeline_balance import pipeline_objective

#: the caps scanned at most before CP-SAT is left the model (few microbatches: the sum matters as
#: much as the slowest device, and the scan would cover every cap)
MAX_CAPS = 256

Recompute = Literal["choose", "full", "selective", "none"]


@dataclass(frozen=True)
class Row:
    """One memory constraint of a device: ``n * per_layer + f * per_full + s * per_sel`` plus
    ``any_full`` where f > 0, at most ``limit`` (integers)."""

    per_layer: int
    per_full: int
    per_sel: int
    any_full: int
    limit: int

    def over(self, n: int, f: int) -> int:
        """How far n layers with f fully recomputed exceed the limit before selective recompute."""
        return n * self.per_layer + f * self.per_full + (self.any_full if f else 0) - self.limit


@dataclass(frozen=True)
class DeviceChoice:
    """A device's least time per microbatch for its layers (``time``) and the recomputation that
    fits them (``full``, ``sel`` layers)."""

    time: int
    full: int
    sel: int


def least_recompute(
    rows: Sequence[Row], n: int, cost_full: int, cost_sel: int, recompute: Recompute
) -> DeviceChoice | None:
    """The cheapest recomputation of ``n`` layers that meets every row (its time only), or None
    when none does: with ``recompute`` "choose", each count F of fully recomputed layers with the
    fewest selectively recomputed ones that then fit; pinned, every layer recomputed that way."""
    if recompute != "choose":
        f, s = (n, 0) if recompute == "full" else (0, n) if recompute == "selective" else (0, 0)
        fits = all(r.over(n, f) + s * r.per_sel <= 0 for r in rows)
        return DeviceChoice(f * cost_full + s * cost_sel, f, s) if fits else None
    best: DeviceChoice | None = None
    for f in range(n + 1):
        s = 0
        for r in rows:
            over = r.over(n, f)
            if over > 0:
                if r.per_sel >= 0:
                    s = n + 1  # selective recompute does not help this row
                    break
                s = max(s, -(-over // -r.per_sel))
        if s <= n - f and (best is None or f * cost_full + s * cost_sel < best.time):
            best = DeviceChoice(f * cost_full + s * cost_sel, f, s)
    return best


def _grows(rows: Sequence[Row], recompute: Recompute) -> bool:
    """Whether a device that cannot fit N layers cannot fit more either: each row's bytes per layer
    with the most memory-saving recomputation allowed are not negative."""

    def saving(r: Row) -> int:
        if recompute == "choose":
            return min(r.per_full, r.per_sel, 0)
        return {"full": r.per_full, "selective": r.per_sel}.get(recompute, 0)

    return all(r.per_layer + saving(r) >= 0 for r in rows)


class _Device:
    """g_i(N) of one device (module docstring), computed as asked and kept."""

    def __init__(self, rows: Sequence[Row], extra: int, per_layer: int, costs: tuple[int, int], recompute: Recompute):
        self.rows, self.extra, self.per_layer, self.costs, self.recompute = rows, extra, per_layer, costs, recompute
        self.choices: dict[int, DeviceChoice | None] = {}

    def choice(self, n: int) -> DeviceChoice | None:
        if n not in self.choices:
            c = least_recompute(self.rows, n, *self.costs, self.recompute)
            self.choices[n] = c and DeviceChoice(n * self.per_layer + self.extra + c.time, c.full, c.sel)
        return self.choices[n]

    def time(self, n: int) -> float:
        c = self.choice(n)
        return float("inf") if c is None else c.time

    def most(self, cap: float, layers: int) -> int:
        """The most layers (up to ``layers``, what a device can hold beside the others' one each)
        this device takes within ``cap``; 0 if not one."""
        n = 0
        while n < layers and self.time(n + 1) <= cap:
            n += 1
        return n


def _least_sum(devices: list[_Device], caps: list[int], layers: int) -> list[int]:
    """Layers per device, 1 <= N_i <= caps[i], sum ``layers``, least sum of g_i: a dynamic
    program over the devices in turn and the layers placed so far (ties to fewer layers on the
    earlier devices)."""
    inf = float("inf")
    cost = [0.0] + [inf] * layers  # least sum over the devices so far, by layers placed
    picks: list[list[int]] = []
    for d, cap in zip(devices, caps):
        times = [d.time(n) for n in range(cap + 1)]
        nxt, pick = [inf] * (layers + 1), [0] * (layers + 1)
        for placed, base in enumerate(cost):
            if base == inf:
                continue
            for n in range(1, min(cap, layers - placed) + 1):
                value = base + times[n]
                if value < nxt[placed + n]:
                    nxt[placed + n], pick[placed + n] = value, n
        cost = nxt
        picks.append(pick)
    counts, left = [], layers
    for pick in reversed(picks):
        counts.append(pick[left])
        left -= pick[left]
    return counts[::-1]


@dataclass(frozen=True)
class Balanced:
    """The optimum: per device its layers, fully and selectively recomputed layers; the objective."""

    layers: tuple[int, ...]
    full: tuple[int, ...]
    sel: tuple[int, ...]
    objective: int


def memory_balanced(
    rows: list[list[Row]],
    extras: list[int],
    per_layer: int,
    costs: tuple[int, int],
    layers: int,
    m: int,
    recompute: Recompute,
) -> Balanced | None:
    """The optimum (module docstring) for devices of one chunk each with memory ``rows`` and
    ``extras``, layers costing ``per_layer`` and ``costs`` = (full, selective) recomputation per
    layer; None where this form does not apply or where no split fits (CP-SAT then decides)."""
    if not all(_grows(r, recompute) for r in rows):
        return None
    devices = [_Device(r, x, per_layer, costs, recompute) for r, x in zip(rows, extras)]
    if any(d.time(1) == float("inf") for d in devices):
        return None
    most = layers - len(devices) + 1  # the most one device holds
    bound = layers * per_layer + sum(extras)  # the least sum: no recomputation
    cap = max(d.time(1) for d in devices)
    caps = [d.most(cap, most) for d in devices]
    while sum(caps) < layers:  # the least feasible cap
        cap = min(d.time(c + 1) for d, c in zip(devices, caps) if c < most)
        if cap == float("inf"):
            return None
        caps = [d.most(cap, most) for d in devices]
    best: tuple[float, list[int]] | None = None
    for _ in range(MAX_CAPS):
        counts = _least_sum(devices, caps, layers)
        times = [d.time(n) for d, n in zip(devices, counts)]
        value = pipeline_objective(max(times), sum(times), m, 1, False)
        if best is None or value < best[0]:
            best = (value, counts)
        cap = min((d.time(c + 1) for d, c in zip(devices, caps) if c < most), default=float("inf"))
        if cap == float("inf") or pipeline_objective(cap, bound, m, 1, False) >= best[0]:
            chosen = [(n, d.choice(n)) for d, n in zip(devices, best[1])]
            return Balanced(
                tuple(n for n, _ in chosen),
                tuple(c.full for _, c in chosen if c is not None),
                tuple(c.sel for _, c in chosen if c is not None),
                int(best[0]),
            )
        caps = [d.most(cap, most) for d in devices]
    return None
