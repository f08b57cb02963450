"""Transfer classes: the same transfer made at once by every replica, and its symmetric form.

A *class* is one logical transfer (a DP collective of one stage, a pipeline boundary, a
host/NVMe/CPU stream of one stage) listed for all of its *copies*: the data-parallel groups
of the stage's tensor ranks, or every (dp, tp) rank. Each copy is a list of phases; a
phase is a set of (source GPU, route, bytes) flows, a step count and an extra fixed time.
Classes are built at unit size and scaled.

* full simulation: copy c becomes an engine transfer with every flow at weight 1;
* symmetric simulation: only the representative GPU's flows of copy 0 are instantiated,
  each flow weighted on each link by
      w(L) = (bytes all copies put on L) / (bytes the representative flows put on L),
  so under max-min sharing it gets the rate it would get with all copies present; by
  symmetry the other members' flows finish at the same time.
Phase latency = steps * (slowest route's one-way latency) + the extra time (in the symmetric
form, of the representative's routes: when copies' routes differ in latency, e.g. GPUs that
reach their NIC through the host bridge, the full simulation lets the replicas drift apart
by that difference, which staggers their use of the shared links rather than adding up).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hwprofiles.algorithms import Collective, latency_steps, uses_trees
from simulator.cost.collectives import in_pass_wait, sync_bus_wait, sync_wait
from simulator.cost.layout import rank_of
from simulator.des.engine import FlowSpec, Phase
from simulator.des.flows import PhasePlan, collective_phases
from simulator.des.topology import Topology

# one phase of one copy: ((src gpu, links, unit bytes), ...), steps, extra seconds, link load per byte
RoutedPhase = tuple[tuple[tuple[int, tuple[int, ...], float], ...], float, float, float]
Weighted = list[tuple[tuple[FlowSpec, ...], float, tuple[tuple[int, float], ...]]]


@dataclass(frozen=True)
class TransferClass:
    """A class of transfers: ``key`` names it whole (its maker and the maker's arguments), so
    that, with the topology and the layout's (t, d), it fixes what ``make`` builds (each copy's
    routed phases at unit size)."""

    key: tuple
    make: Callable[[], list[list[RoutedPhase]]] = field(compare=False)


@dataclass
class _Built:
    """The classes built for one layout (t, d) on one topology, and their symmetric weights."""

    classes: dict[tuple, list[list[RoutedPhase]]] = field(default_factory=dict)
    weighted: dict[tuple, Weighted] = field(default_factory=dict)


#: built classes by topology, then by layout (t, d), the last LAYOUTS_KEPT layouts of each: the
#: planner simulates several finalists of one layout in a worker (a 1T job: five of six), which
#: then share the routing and weighing of their pipeline boundaries and data-parallel groups
_BUILT: weakref.WeakKeyDictionary[Topology, OrderedDict[tuple[int, int], _Built]] = weakref.WeakKeyDictionary()
LAYOUTS_KEPT = 8


def forget_built() -> None:
    """Drop every kept class (a simulation then builds its classes anew, as a first one does)."""
    _BUILT.clear()


def _built(topo: Topology, t: int, d: int) -> _Built:
    """The classes built so far for layout (t, d) on ``topo`` (kept across simulations)."""
    layouts = _BUILT.setdefault(topo, OrderedDict())
    got = layouts.get((t, d))
    if got is None:
        got = layouts[(t, d)] = _Built()
        while len(layouts) > LAYOUTS_KEPT:
            layouts.popitem(last=False)
    else:
        layouts.move_to_end((t, d))
    return got


class Transfers:
    """Builds, caches and instantiates transfer classes for one plan on one topology. A class's
    routed copies and symmetric weights depend only on its key, the topology and (t, d), and are
    kept for later simulations of the same layout (:data:`_BUILT`); its engine phases at a size
    are kept for this plan's."""

    def __init__(self, topo: Topology, p: int, t: int, d: int, full: bool, free: bool):
        self.topo = topo
        self.p, self.t, self.d = p, t, d
        self.full = full
        self.free = free
        built = _built(topo, t, d)
        self._classes = built.classes
        self._weighted = built.weighted
        self._cache: dict[tuple, tuple[list[Phase], float]] = {}

    def gpu(self, pp: int, dp: int, tp: int) -> int:
        return rank_of(pp, dp, tp, self.t, self.d)

    def phases(
        self, cls: TransferClass, copy: int, rep_gpu: int, size: float, count_gpu: int = -1
    ) -> tuple[list[Phase], float]:
        """(engine phases of copy ``copy`` of class ``cls`` for ``size`` bytes, bytes that
        ``count_gpu`` sends in them). ``rep_gpu``: the simulated GPU (symmetric mode)."""
        if self.free or size <= 0.0:
            return [], 0.0
        key = cls.key
        ckey = (key, copy, size, count_gpu, rep_gpu)
        got = self._cache.get(ckey)
        if got is not None:
            return got
        if self.full:
            weighted = self._unweighted(self._class(cls)[copy])
        else:
            cached = self._weighted.get((key, rep_gpu))
            if cached is None:
                cached = self._weigh(self._class(cls), rep_gpu)
                self._weighted[(key, rep_gpu)] = cached
            weighted = cached
        sent = (
            size * sum(b for (_, _, srcs) in weighted for (s, b) in srcs if s == count_gpu) if count_gpu >= 0 else 0.0
        )
        out = [
            Phase(tuple(FlowSpec(f.links, f.weights, f.nbytes * size) for f in specs), lat)
            for (specs, lat, _) in weighted
        ]
        self._cache[ckey] = (out, sent)
        return out, sent

    def _class(self, cls: TransferClass) -> list[list[RoutedPhase]]:
        got = self._classes.get(cls.key)
        if got is None:
            got = self._classes[cls.key] = cls.make()
        return got

    def _latency(self, flows: tuple, steps: float, extra: float) -> float:
        return steps * max((self.topo.latency(links) for (_, links, _) in flows), default=0.0) + extra

    def _unweighted(self, copy: list[RoutedPhase]) -> Weighted:
        return [
            (
                tuple(FlowSpec(links, (1.0,) * len(links), b * load) for (_, links, b) in flows),
                self._latency(flows, steps, extra),
                tuple((s, b) for (s, _, b) in flows),
            )
            for flows, steps, extra, load in copy
        ]

    def _weigh(self, copies: list[list[RoutedPhase]], rep_gpu: int) -> Weighted:
        out: Weighted = []
        for pi, (flows, steps, extra, load) in enumerate(copies[0]):
            total: dict[int, float] = {}
            for cp in copies:
                for _, links, b in cp[pi][0]:
                    for lid in links:
                        total[lid] = total.get(lid, 0.0) + b
            mine_flows = [f for f in flows if f[0] == rep_gpu]
            mine: dict[int, float] = {}
            for _, links, b in mine_flows:
                for lid in links:
                    mine[lid] = mine.get(lid, 0.0) + b
            specs = tuple(
                FlowSpec(links, tuple(total[lid] / mine[lid] for lid in links), b * load)
                for (_, links, b) in mine_flows
            )
            lat = self._latency(flows, steps, extra)
            out.append((specs, lat, tuple((s, b) for (s, _, b) in flows)))
        return out

    def _routed(self, phases: list[PhasePlan], extra: float = 0.0) -> list[RoutedPhase]:
        route = self.topo.route
        intra = self.topo.cluster.node.intra_node.latency_s
        return [
            (
                tuple((s, route(s, d), b) for (s, d, b) in ph.flows),
                ph.steps,
                (extra if i == len(phases) - 1 else 0.0) + ph.intra_steps * intra,
                ph.load,
            )
            for i, ph in enumerate(phases)
        ]

    # ------------------------------------------------------------------ class makers

    def _data_parallel(self, op: Collective, gpus: list[int]) -> list[RoutedPhase]:
        """The routed phases of a data-parallel collective over ``gpus``: inside one node each
        latency step also pays the busy-core wait (collectives.in_pass_wait), the call the ranks'
        sync wait (collectives.sync_wait) and each byte theirs (collectives.sync_bus_wait: a link
        time per byte of load / B + w, so load + w * B), as the closed form's links do
        (collectives.dp_link, simulator.cost.zero3.shard_links)."""
        cluster = self.topo.cluster
        phases = collective_phases(self.topo, op, gpus, 1.0)
        if len(gpus) <= 1 or len({g // cluster.gpus_per_node for g in gpus}) > 1:
            return self._routed(phases, 0.0)
        steps = latency_steps(len(gpus), op, uses_trees(cluster.node.backend))
        extra_load = sync_bus_wait(cluster) * cluster.node.intra_node.bytes_per_s  # w * B
        if extra_load:
            phases = [replace(ph, load=ph.load + extra_load) for ph in phases]
        return self._routed(phases, steps * in_pass_wait(cluster) + sync_wait(cluster))

    def dp_class(self, stage: int, op: Collective) -> TransferClass:
        """``op`` over the data-parallel group of each tensor rank of ``stage`` (copy = tp)."""

        def make() -> list[list[RoutedPhase]]:
            return [self._data_parallel(op, [self.gpu(stage, dp, tp) for dp in range(self.d)]) for tp in range(self.t)]

        return TransferClass(("dp", stage, op), make)

    def shard_class(self, stage: int, op: Collective, n: int) -> TransferClass:
        """``op`` over each shard group of hybrid sharding: n consecutive data-parallel ranks of
        each tensor rank of ``stage`` (copy = replica * t + tp)."""

        def make() -> list[list[RoutedPhase]]:
            return [
                self._data_parallel(op, [self.gpu(stage, r * n + k, tp) for k in range(n)])
                for r in range(self.d // n)
                for tp in range(self.t)
            ]

        return TransferClass(("shard", stage, op, n), make)

    def replica_class(self, stage: int, n: int) -> TransferClass:
        """All-reduce over each replicate group of hybrid sharding: the data-parallel ranks
        n apart, one per shard group (copy = shard index * t + tp)."""

        def make() -> list[list[RoutedPhase]]:
            return [
                self._data_parallel(Collective.ALL_REDUCE, [self.gpu(stage, r * n + k, tp) for r in range(self.d // n)])
                for k in range(n)
                for tp in range(self.t)
            ]

        return TransferClass(("replica", stage, n), make)

    def p2p_class(self, s0: int, s1: int, extra: float) -> TransferClass:
        """Every (dp, tp) rank of stage s0 sends to its peer of stage s1 (copy = dp*t + tp);
        ``extra``: the receivers' all-gather after a scattered send."""

        def make() -> list[list[RoutedPhase]]:
            return [
                self._routed(
                    collective_phases(
                        self.topo, Collective.SEND_RECV, [self.gpu(s0, dp, tp), self.gpu(s1, dp, tp)], 1.0
                    ),
                    extra,
                )
                for dp in range(self.d)
                for tp in range(self.t)
            ]

        return TransferClass(("p2p", s0, s1, extra), make)

    def pair_all_reduce_class(self, s0: int, s1: int) -> TransferClass:
        """All-reduce between each (dp, tp) rank of stage s0 and its peer of s1 (tied embeddings)."""

        def make() -> list[list[RoutedPhase]]:
            return [
                self._routed(
                    collective_phases(
                        self.topo, Collective.ALL_REDUCE, [self.gpu(s0, dp, tp), self.gpu(s1, dp, tp)], 1.0
                    )
                )
                for dp in range(self.d)
                for tp in range(self.t)
            ]

        return TransferClass(("pair-all-reduce", s0, s1), make)

    def host_class(self, stage: int, what: str) -> TransferClass:
        """Each (dp, tp) rank of ``stage`` on its host path: 'd2h', 'h2d' (PCIe), 'cpu' (the
        host optimizer's throughput) or 'nvme' (copy = dp*t + tp)."""
        topo = self.topo

        def links_of(g: int) -> tuple[int, ...]:
            node = g // topo.gpus_per_node
            if what == "d2h":
                return topo.to_host(g)
            if what == "h2d":
                return topo.from_host(g)
            if what == "cpu":
                return topo.cpu(node)
            return topo.nvme(node)

        def make() -> list[list[RoutedPhase]]:
            out: list[list[RoutedPhase]] = []
            for dp in range(self.d):
                for tp in range(self.t):
                    g = self.gpu(stage, dp, tp)
                    out.append([(((g, links_of(g), 1.0),), 1, 0.0, 1.0)])
            return out

        return TransferClass(("host", stage, what), make)


def copy_index(full: bool, dp: int, tp: int, t: int, per: str, shard: int = 1) -> int:
    """Index of a rank's copy in a class: per 'tp' (DP groups), 'dptp' (every rank), 'shard'
    (hybrid sharding's shard groups of ``shard`` ranks) or 'replica' (its replicate groups)."""
    if not full:
        return 0
    if per == "shard":
        return (dp // shard) * t + tp
    if per == "replica":
        return (dp % shard) * t + tp
    return tp if per == "tp" else dp * t + tp
