"""Collectives decomposed into flows on the topology, with NCCL's algorithm choice.

Ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005), S = the full buffer in bytes,
n = ranks. Every ring edge carries, concurrently and pipelined in chunks as NCCL does:
    all-reduce                 2(n-1)/n * S      in 2(n-1) steps
    reduce-scatter, all-gather (n-1)/n * S       in  n-1  steps
    broadcast (pipelined chain) S                in  n-1  steps
    point-to-point             S                 in  1 step
so at link bandwidth B a ring all-reduce takes 2(n-1)/n * S / B plus the latency terms.

Algorithm choice (what NCCL picks for the group's shape):
* group inside one node: a ring through NVSwitch/NVLink (or the PCIe fabric);
* one member per node: a flat ring over the NICs;
* k > 1 members on each of N nodes: hierarchical (NCCL's multi-channel ring / CollNet
  decomposition): reduce-scatter inside each node (ring of k), then k concurrent inter-node
  rings (one per local index, each on its own NIC) on S/k, then all-gather inside each node.
  Per rank this moves 2(k-1)/k * S + 2(N-1)/N * S/k = 2(kN-1)/(kN) * S: the same volume as
  a flat ring, with the inter-node share split over the node's NICs.
* irregular shapes (unequal members per node): a flat ring ordered by node.
Latency: per step the slowest edge's route latency; the steps are NCCL's (the same rule as
:mod:`simulator.cost.collectives`, hwprofiles.algorithms.latency_split): a ring over n ranks on N
nodes pays n-N steps inside nodes and N-1 across (twice for an all-reduce), or the double binary
tree's 2*ceil(log2 n) when that costs less (NCCL uses trees when latency-bound; gloo runs rings
only). A hierarchical collective's inter-node phase pays the steps across nodes and its
intra-node phases share the rest; a flat ring across nodes pays its steps inside nodes at the
node's own link latency (:attr:`PhasePlan.intra_steps`).
Inside a node whose profile fits a collective on its own (gloo: NodeProfile.collectives), that
collective loads the links and pays latency at its fitted rates (:func:`own_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from hwprofiles.algorithms import Collective, latency_split, latency_steps, uses_trees
from hwprofiles.schema import CollectiveName
from simulator.des.topology import Topology


@dataclass(frozen=True)
class PhasePlan:
    """One phase of a collective: (src GPU, dst GPU, bytes) flows and the number of latency
    steps; ``load``: link time per byte relative to the link's bandwidth (a collective slower
    than its link, fitted on its own, loads the links with ``load`` times its bytes);
    ``intra_steps``: steps a ring across nodes takes inside a node, each at the node's link
    latency rather than the slowest route's."""

    flows: tuple[tuple[int, int, float], ...]
    steps: float
    load: float = 1.0
    intra_steps: float = 0.0


def own_fit(topo: Topology, op: Collective, gpus: list[int], phases: list[PhasePlan]) -> list[PhasePlan]:
    """``phases`` priced with the node's own fit of ``op`` when the group sits in one node and
    calibrate fitted that collective (NodeProfile.collectives): bytes load the links at
    intra_node bandwidth / fitted bandwidth each, and every step costs the fitted latency
    instead of the link's (steps scaled by fitted / link latency; a link without latency has
    none to scale, so a profile that fits collectives gives its link a latency, as calibrate does)."""
    node = topo.cluster.node
    if not node.collectives or op not in node.collectives or len({g // topo.gpus_per_node for g in gpus}) > 1:
        return phases
    bw, lat = node.intra_figures(cast(CollectiveName, op.value))  # a key of node.collectives (checked above)
    link_lat = node.intra_node.latency_s
    load = node.intra_node.bytes_per_s / bw
    steps = lat / link_lat if link_lat > 0 else 1.0
    return [PhasePlan(ph.flows, ph.steps * steps, ph.load * load) for ph in phases]


def algorithm(topo: Topology, gpus: list[int]) -> str:
    """'none', 'ring' (one node or one member per node), 'hierarchical' or 'flat' (irregular)."""
    if len(gpus) <= 1:
        return "none"
    per: dict[int, int] = {}
    for g in gpus:
        k = g // topo.gpus_per_node
        per[k] = per.get(k, 0) + 1
    if len(per) == 1 or all(c == 1 for c in per.values()):
        return "ring"
    if len(set(per.values())) == 1:
        return "hierarchical"
    return "flat"


def _ring(order: list[int], per_edge: float, closed: bool = True) -> tuple[tuple[int, int, float], ...]:
    n = len(order)
    edges = n if closed else n - 1
    return tuple((order[i], order[(i + 1) % n], per_edge) for i in range(edges))


def ring_phases(op: Collective, order: list[int], size: float, trees: bool = True) -> list[PhasePlan]:
    """A single ring (or chain for broadcast) through ``order``; ``trees``: latency steps as NCCL
    counts them (module docstring)."""
    n = len(order)
    if n <= 1 or size <= 0:
        return []
    if op == Collective.ALL_REDUCE:
        return [PhasePlan(_ring(order, 2 * (n - 1) / n * size), latency_steps(n, op, trees))]
    if op in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        return [PhasePlan(_ring(order, (n - 1) / n * size), latency_steps(n, op, trees))]
    if op == Collective.BROADCAST:
        return [PhasePlan(_ring(order, size, closed=False), latency_steps(n, op, trees))]
    raise ValueError(f"unknown collective {op!r}")


def _loaded(phases: list[PhasePlan], load: float) -> list[PhasePlan]:
    return [PhasePlan(ph.flows, ph.steps, ph.load * load, ph.intra_steps) for ph in phases] if load != 1.0 else phases


def _split(topo: Topology, op: Collective, n: int, nodes: int, trees: bool) -> tuple[int, int]:
    """(intra-node, inter-node) latency steps of ``op`` over ``n`` ranks on ``nodes`` nodes, the
    tree chosen over the ring at the node's link and NIC latencies (hwprofiles.algorithms)."""
    node = topo.cluster.node
    intra = node.intra_node.latency_s
    inter = node.nic.latency_s if node.nic is not None else intra
    return latency_split(n, nodes, op, trees, intra, inter)


def collective_phases(topo: Topology, op: Collective, gpus: list[int], size: float) -> list[PhasePlan]:
    """Phases of ``op`` on the group ``gpus`` (in group order) of a buffer of ``size`` bytes."""
    n = len(gpus)
    if n <= 1 or size <= 0:
        return []
    if op == Collective.SEND_RECV:
        if n != 2:
            raise ValueError("send/recv needs exactly two GPUs")
        return own_fit(topo, op, gpus, [PhasePlan(((gpus[0], gpus[1], size),), 1)])
    algo = algorithm(topo, gpus)
    order = sorted(gpus)
    trees = uses_trees(topo.cluster.node.backend)
    G = topo.gpus_per_node
    nodes: dict[int, list[int]] = {}
    for g in order:
        nodes.setdefault(g // G, []).append(g)
    # a ring across many nodes reaches less bus bandwidth (Network.busbw_factor): its flows
    # load the links with proportionally more time per byte (PhasePlan.load)
    stretch = 1.0 / topo.cluster.network.busbw_factor(len(nodes))
    in_node, across = _split(topo, op, n, len(nodes), trees)
    if algo == "flat" and op != Collective.BROADCAST:
        (ph,) = ring_phases(op, order, size, trees)
        return [PhasePlan(ph.flows, across, stretch, in_node)]
    if algo != "hierarchical" or op == Collective.BROADCAST:
        return own_fit(topo, op, gpus, _loaded(ring_phases(op, order, size, trees), stretch))
    members = list(nodes.values())
    k = len(members[0])
    intra_phases = 2 if op == Collective.ALL_REDUCE else 1

    def intra(op2: Collective) -> PhasePlan:
        flows = [f for mem in members for f in ring_phases(op2, mem, size, trees)[0].flows]
        return PhasePlan(tuple(flows), in_node / intra_phases)

    def inter(op2: Collective) -> PhasePlan:
        flows = [f for j in range(k) for f in ring_phases(op2, [mem[j] for mem in members], size / k, trees)[0].flows]
        return PhasePlan(tuple(flows), across, stretch)

    if op == Collective.ALL_REDUCE:
        return [intra(Collective.REDUCE_SCATTER), inter(Collective.ALL_REDUCE), intra(Collective.ALL_GATHER)]
    if op == Collective.REDUCE_SCATTER:
        return [intra(Collective.REDUCE_SCATTER), inter(Collective.REDUCE_SCATTER)]
    if op == Collective.ALL_GATHER:
        return [inter(Collective.ALL_GATHER), intra(Collective.ALL_GATHER)]
    raise ValueError(f"unknown collective {op!r}")


def bytes_sent_per_rank(phases: list[PhasePlan], gpu: int) -> float:
    """Bytes that ``gpu`` sends over all phases (for volume checks)."""
    return sum(b for ph in phases for (s, _, b) in ph.flows if s == gpu)
