"""Flow-level network model: concurrent transfers share links with max-min fairness.

A flow moves ``bytes`` along a route of directed links. Each flow has a weight per link:
the number of identical flows it stands for there (1 in a full simulation; in the symmetric
simulation, the data-parallel replicas' and tensor ranks' identical copies that cross the
same link, see :mod:`simulator.des.program`). Rates are the weighted max-min fair allocation,
computed by progressive filling (Bertsekas & Gallager, "Data Networks", section 6.5.2):
raise every unfrozen flow's rate together; the first link to fill,
``residual(L) / sum of unfrozen weights on L``, fixes the rate of its flows; repeat.
Rates are recomputed whenever a flow starts or ends (lazily, once per simulated instant). A
transfer's only flow that starts on links no other flow uses runs alone at its solo rate, with
an end event of its own, until another flow joins one of its links (:meth:`Network.add`): the
rate progressive filling would give it, without filling it again at every other start and end
(most of a pipeline's sends between stages).

A flow is over when what is left of it is within :func:`simulator.des.flow.finish_tolerance` (a
floating-point leftover, not data): see there for why a simulation with it always ends.
"""

from __future__ import annotations

import math

from simulator.des.flow import Flow, clock_tolerance, max_min_fill


class Network:
    """Active flows, their max-min rates, and per-link byte counters.

    ``link_bytes[L]``: bytes that crossed link L (all copies included, counted when each flow
    starts); ``series[L]`` (when ``record`` is true) lists (time, load/capacity) changes for
    the trace, ``load`` the current load of each link. A flow enters only by :meth:`add` and
    leaves only by :meth:`pop_finished`: they keep ``users`` (the flows on each link, a flow
    twice on a link whose route crosses it twice), ``shared`` (the links with more than one),
    the flows that left since the last allocation and each flow's ``solo`` rate, which the
    allocation reads. Per-link figures are lists indexed by link id, and each route's solo
    rate is worked out once (:meth:`_solo`): a pipeline sends one flow per microbatch on the
    same route, tens of thousands per iteration.
    """

    def __init__(self, capacities: list[float], record: bool = True):
        self.cap = capacities
        self.flows: list[Flow] = []
        self.last = 0.0
        self.dirty = False
        self._bytes = [0.0] * len(capacities)  # bytes that crossed each link (link_bytes)
        self.load: dict[int, float] = {}
        self.record = record
        self.series: dict[int, list[tuple[float, float]]] = {}
        self.reallocations = 0
        self.users = [0] * len(capacities)  # flows in flight on each link (a link twice on one route: twice)
        self.shared = 0  # links with more than one of them
        self._seq = 0  # the next flow's Flow.seq
        self._settled = 0  # the seq of the first flow that entered since the last allocation
        self._left: list[Flow] = []  # the flows that left since the last allocation
        # id(links) -> (links, weights, solo rate): every route a flow took (link_bytes' links)
        self._routes: dict[int, tuple[tuple[int, ...], tuple[float, ...], float]] = {}
        self._more_links: set[int] = set()  # the links of routes not kept in _routes
        self._lone_on: list[Flow | None] = [None] * len(capacities)  # the lone flow on each link

    @property
    def link_bytes(self) -> dict[int, float]:
        """Bytes that crossed each link any flow took (all copies included)."""
        used = {lid for links, _, _ in self._routes.values() for lid in links} | self._more_links
        return {lid: self._bytes[lid] for lid in sorted(used)}

    def advance(self, now: float) -> None:
        """Move every flow forward to ``now`` at its current rate."""
        dt = now - self.last
        if dt > 0.0:
            for f in self.flows:
                f.rem -= f.rate * dt
        self.last = now

    def _solo(self, links: tuple[int, ...], weights: tuple[float, ...]) -> float:
        """The rate of a flow alone on ``links``: its tightest link's capacity / weight, kept per
        route object (the route holds its tuples, so their ids stay theirs)."""
        got = self._routes.get(id(links))
        if got is not None and got[0] is links and got[1] is weights:
            return got[2]
        cap = self.cap
        solo = min([cap[lid] / w for lid, w in zip(links, weights)])
        if got is None:
            self._routes[id(links)] = (links, weights, solo)
        else:  # these links with other weights (not kept): their links still count in link_bytes
            self._more_links.update(links)
        return solo

    def add(self, flow: Flow, now: float, may_run_alone: bool = False) -> float | None:
        """Start a flow; its bytes (times its weights) count towards each link's total.

        A flow that ``may_run_alone`` (a transfer's only flow) and finds no other flow on any of
        its links runs *alone*: at its solo rate, outside ``flows`` and the allocation, and its
        end time is returned for the caller to schedule (None for any other flow, which the
        allocation rates). Filling it with the others would give it that rate (progressive
        filling freezes a flow alone on its links at its tightest link's share) and leave theirs
        as they are, until a flow joins one of its links before its end: it then enters
        ``flows`` (:meth:`_join`) and its scheduled end no longer counts (``lone`` is false). A
        lone flow leaves its links at its end, or when a later flow finds it there over
        (:meth:`leave`). A pipeline's sends between stages mostly run alone."""
        if now != self.last:
            self.advance(now)
        links = flow.links
        if not links:  # on no link: unconstrained, whatever the others do
            self._enter(flow)
            flow.rate = math.inf
            return None
        weights = flow.weights
        lb, users, lone_on = self._bytes, self.users, self._lone_on
        size = flow.size
        alone = may_run_alone and not self.record
        for lid, w in zip(links, weights):
            lb[lid] += size * w
            other = lone_on[lid]
            if other is not None:  # the only flow on the link, running alone
                if other.until <= now:
                    self.leave(other)
                else:
                    self._join(other, now)
            n = users[lid] + 1
            users[lid] = n
            if n > 1:
                alone = False
                if n == 2:
                    self.shared += 1
        flow.solo = self._solo(links, weights)
        if not alone:
            self._enter(flow)
            return None
        flow.lone = True
        flow.start = now
        flow.rate = flow.solo
        flow.until = until = now + size / flow.solo
        for lid in links:
            lone_on[lid] = flow
        return until

    def leave(self, flow: Flow) -> None:
        """A flow that ran alone to its end leaves its links (no other flow's rate changes); once."""
        if flow.left:
            return
        flow.left = True
        users, lone_on = self.users, self._lone_on
        for lid in flow.links:
            users[lid] -= 1
            lone_on[lid] = None

    def _enter(self, flow: Flow) -> None:
        """``flow`` joins ``flows``, which the next allocation rates."""
        self.flows.append(flow)
        self.dirty = True
        flow.seq = self._seq
        self._seq += 1

    def _join(self, flow: Flow, now: float) -> None:
        """A flow that ran alone until ``now`` (another flow joins one of its links) enters ``flows``
        with what is left of it at its solo rate; its scheduled end no longer counts."""
        flow.lone = False
        lone_on = self._lone_on
        for lid in flow.links:
            lone_on[lid] = None
        flow.rem = flow.size - flow.solo * (now - flow.start)
        self._enter(flow)

    def pop_finished(self, now: float) -> list[int]:
        """Advance to ``now``; remove the flows finished within :func:`simulator.des.flow.finish_tolerance` and
        return their owners."""
        self.advance(now)
        done: list[int] = []
        keep: list[Flow] = []
        clock = clock_tolerance(now)  # finish_tolerance: max(f.tol, rate * clock)
        for f in self.flows:
            tol = f.rate * clock
            if tol < f.tol:
                tol = f.tol
            if f.rem <= tol:
                done.append(f.owner)
                self._release(f)
            else:
                keep.append(f)
        if done:
            self.flows = keep
            self.dirty = True
        return done

    def _release(self, flow: Flow) -> None:
        """Take a finished flow off its links' counts."""
        users = self.users
        self._left.append(flow)
        for lid in flow.links:
            n = users[lid] - 1
            users[lid] = n
            if n == 1:
                self.shared -= 1

    def allocate(self, now: float) -> float:
        """Weighted max-min rates by progressive filling; returns the next completion time.

        Only the flows that share links, directly or through others, with a link a flow entered
        or left since the last allocation (:meth:`_changed_flows`) are filled again: a set of
        flows that shares no link with the others is filled by progressive filling exactly as
        it would be among them (its links' shares change only when its own flows freeze, and the
        link found first among equal shares comes first in both), so the others' rates stand
        as they are, to the bit. A ZeRO-3 layer gather keeps one such set per pipeline stage in
        flight. With ``record`` (a trace's link loads) every flow is filled."""
        self.dirty = False
        self.reallocations += 1
        flows = self.flows
        cap = self.cap
        if not self.shared:  # no link with two flows (or one flow twice: filled, its solo rate is not its rate)
            self._settle()
            if flows:
                return self._allocate_disjoint(now, flows)
            if self.record:
                self._record(now, {})
                self.load = {}
            return math.inf
        if self.record:
            residual = max_min_fill(flows, cap)
            new_load = {lid: cap[lid] - r for lid, r in residual.items()}
            self._record(now, new_load)
            self.load = new_load
        else:
            max_min_fill(self._changed_flows(), cap)
        self._settle()
        for f in flows:
            if f.rate < 0.0:  # a flow on no link: unconstrained
                f.rate = math.inf
        nxt = math.inf
        for f in flows:
            if f.rate > 0.0:
                t = f.rem / f.rate
                if t < nxt:
                    nxt = t
        return now + max(nxt, 0.0)

    def _settle(self) -> None:
        """Every flow's rate is set: none has entered or left since (:meth:`_changed_flows`)."""
        self._left.clear()
        self._settled = self._seq

    def _changed_flows(self) -> list[Flow]:
        """The flows that share a link, directly or through others, with a flow that entered or
        left since the last allocation, in the order they entered the network."""
        flows = self.flows
        stack = [lid for f in self._left for lid in f.links]
        k = len(flows) - 1
        while k >= 0 and flows[k].seq >= self._settled:  # the flows that entered: last in the list
            stack.extend(flows[k].links)
            k -= 1
        on_link: dict[int, list[Flow]] = {}
        for f in flows:
            for lid in f.links:
                on = on_link.get(lid)
                if on is None:
                    on_link[lid] = [f]
                else:
                    on.append(f)
        found: dict[int, Flow] = {}
        seen = set(stack)
        while stack:
            for f in on_link.get(stack.pop(), ()):
                if f.seq not in found:
                    found[f.seq] = f
                    for lid in f.links:
                        if lid not in seen:
                            seen.add(lid)
                            stack.append(lid)
        return [found[k] for k in sorted(found)]

    def _allocate_disjoint(self, now: float, flows: list[Flow]) -> float:
        """Flows that share no link with each other (a lone flow among them) each run at their
        tightest link's capacity / weight: what progressive filling gives them (every link's
        first and only freeze is its one flow's)."""
        nxt = math.inf
        new_load: dict[int, float] = {}
        for f in flows:
            if not f.links:  # a flow on no link: unconstrained
                f.rate = math.inf
                continue
            f.rate = rate = f.solo
            if self.record:
                new_load.update((lid, rate * w) for lid, w in zip(f.links, f.weights))
            if f.rem / rate < nxt:
                nxt = f.rem / rate
        if self.record:
            self._record(now, new_load)
            self.load = new_load
        return now + max(nxt, 0.0)

    def _record(self, now: float, new_load: dict[int, float]) -> None:
        old = self.load
        cap = self.cap
        series = self.series
        for lid, x in new_load.items():
            if abs(old.get(lid, 0.0) - x) > 1e-9 * cap[lid]:
                series.setdefault(lid, []).append((now, x / cap[lid]))
        for lid, x in old.items():
            if lid not in new_load and x > 0.0:
                series.setdefault(lid, []).append((now, 0.0))

    def utilization(self, horizon: float) -> dict[int, float]:
        """Average load / capacity of every link that carried traffic, over [0, horizon]."""
        if horizon <= 0:
            return {}
        return {lid: b / (self.cap[lid] * horizon) for lid, b in self.link_bytes.items()}


def fair_rates(
    capacities: list[float], routes: list[tuple[int, ...]], weights: list[tuple[float, ...]] | None = None
) -> list[float]:
    """Max-min fair rates of flows on routes (a pure helper for tests and the analytic side)."""
    net = Network(capacities, record=False)
    fl = []
    for i, r in enumerate(routes):
        w = weights[i] if weights is not None else tuple(1.0 for _ in r)
        f = Flow(1.0, r, w, i)
        fl.append(f)
        net.add(f, 0.0)
    net.allocate(0.0)
    return [f.rate for f in fl]
