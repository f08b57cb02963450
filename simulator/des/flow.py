"""A flow in flight (:class:`Flow`), when it is over (:func:`finish_tolerance`), and the
weighted max-min fair rates of flows by progressive filling (:func:`max_min_fill`): the records
and the allocation that :class:`simulator.des.network.Network` keeps and runs."""

from __future__ import annotations

import math

#: a flow is over when what is left of it is at most this fraction of its size...
FINISH_RTOL = 1e-9
#: ... plus this many bytes (a thousandth of a byte: the rounding of rem's running subtraction)
FINISH_ATOL_BYTES = 1e-3
#: ... or when the rest would take at most this many units in the last place of the clock
FINISH_CLOCK_ULPS = 2.0


def finish_tolerance(size: float, rate: float, now: float) -> float:
    """The bytes that a flow of ``size`` bytes moving at ``rate`` bytes/s may have left at
    simulated time ``now`` and be over (a floating-point leftover, not data):

        max(FINISH_RTOL * size + FINISH_ATOL_BYTES,  FINISH_CLOCK_ULPS * rate * ulp(now))

    Why the second term. The network schedules a flow's end at T = fl(t + rem / rate) and at T
    takes rate * (T - t) bytes off it. The clock's grid has spacing ulp(T), so rounding T leaves
    up to rate * ulp(T) / 2 bytes either side of zero, a figure that grows with the clock: at
    t = 1 s (ulp 2.2e-16 s) a 360 GB/s link leaves 4e-5 bytes, inside the first term; at
    t = 65,536 s (ulp 2**-36 s = 1.46e-11 s) it leaves up to 2.6 bytes. A llama3-70b cp=8 step
    at seq 524288 and global batch 64 on one dgx-h100 got there with 2.49 bytes left of a 1.5 GB
    flow (first term: 1.5 bytes): 2.49 / 360e9 = 6.9e-12 s < ulp / 2, so t + rem / rate rounded
    back to t; the flow was re-armed at t, moved nothing and the run never ended.

    Why it ends every run. A flow still in flight after ``Network.pop_finished`` at ``now``
    has rem > 2 * rate * ulp(now), so its end t + rem / rate >= now + 2 * ulp(now) lies strictly
    after the clock; at that end, what is left of it (|rem| <= rate * ulp / 2, plus the
    relative 2**-53 rounding of each subtraction, inside the first term) is within this
    tolerance with a margin of 4. So every network event ends at least one flow. The second
    term moves a flow's end by at most two ulps of the clock: the DES results of the tests and
    benchmarks are bit for bit those from before it."""
    return max(size_tolerance(size), rate * clock_tolerance(now))


def size_tolerance(size: float) -> float:
    """:func:`finish_tolerance`'s first term, of a flow's size (each Flow keeps its own: ``tol``)."""
    return FINISH_RTOL * size + FINISH_ATOL_BYTES


def clock_tolerance(now: float) -> float:
    """:func:`finish_tolerance`'s second term per byte/s of rate, at the clock ``now`` (times 2, a
    power of two, is exact: the same bits as FINISH_CLOCK_ULPS * rate * ulp(now))."""
    return FINISH_CLOCK_ULPS * math.ulp(now)


class Flow:
    """One transfer in flight. ``owner`` is the engine task that waits for it."""

    __slots__ = (
        "left",
        "links",
        "lone",
        "owner",
        "rate",
        "rem",
        "seq",
        "size",
        "solo",
        "start",
        "tol",
        "until",
        "weights",
    )

    def __init__(self, size: float, links: tuple[int, ...], weights: tuple[float, ...], owner: int):
        self.size = size
        self.rem = size
        self.rate = 0.0
        self.solo = math.inf  # its rate alone on its links (set by Network.add)
        self.tol = size_tolerance(size)  # finish_tolerance's first term
        self.links = links
        self.weights = weights
        self.owner = owner
        self.seq = 0  # its place in the network's flows (set by Network.add)
        self.lone = False  # alone on its links since it started (Network.add): not among ``flows``
        self.start = 0.0  # when it started (a lone flow's progress is worked out from it)
        self.until = math.inf  # a lone flow's end
        self.left = False  # a lone flow that has left its links (Network.leave)


def max_min_fill(flows: list[Flow], cap: list[float]) -> dict[int, float]:
    """Weighted max-min fair rates by progressive filling (Bertsekas & Gallager, Data Networks,
    section 6.5.2): repeatedly find the link whose residual capacity per unit of weight of its
    unfrozen flows is smallest, freeze those flows at that share, and charge it to every link
    they cross. Sets each constrained flow's ``rate`` (flows on no link keep -1) and returns
    the residual capacity of every link used."""
    residual: dict[int, float] = {}
    wsum: dict[int, float] = {}
    count: dict[int, int] = {}
    users: dict[int, list[Flow]] = {}
    for f in flows:
        f.rate = -1.0  # unfrozen marker
        for lid, w in zip(f.links, f.weights):
            if lid in wsum:
                wsum[lid] += w
                count[lid] += 1
                users[lid].append(f)
            else:
                wsum[lid] = w
                count[lid] = 1
                residual[lid] = cap[lid]
                users[lid] = [f]
    unfrozen = len(flows)
    while unfrozen and wsum:
        best = math.inf
        blink = -1
        for lid, ws in wsum.items():
            share = residual[lid] / ws
            if share < best:
                best, blink = share, lid
        if best < 0.0:
            best = 0.0
        for f in users[blink]:
            if f.rate >= 0.0:
                continue
            unfrozen -= 1
            f.rate = best
            for lid, w in zip(f.links, f.weights):
                residual[lid] -= w * best
                c = count[lid] - 1
                if c == 0:
                    del wsum[lid]
                    count[lid] = 0
                else:
                    count[lid] = c
                    wsum[lid] -= w
        wsum.pop(blink, None)
    return residual
