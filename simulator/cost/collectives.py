"""Closed-form (alpha-beta) collective times of a placed group (analytic estimate, and the DES's
in-pass collectives and receiver all-gathers).

Ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005), S = bytes per rank's buffer,
n = ranks on N nodes, B = bus bandwidth (bytes/s), a = per-step latency inside a node, A across:
    all-reduce:              2(n-1)/n * S / B + 2(n-N) a + 2(N-1) A
    reduce-scatter, all-gather: (n-1)/n * S / B + (n-N) a + (N-1) A
    point-to-point:          S / B + A (a inside a node)
(NCCL's split of a ring's steps, hwprofiles.algorithms.latency_split).
NCCL switches its all-reduce to double binary trees when latency dominates; we take the
ring bandwidth term with the smaller of the ring and tree latency terms (2*ceil(log2 n) steps,
the top 2*ceil(log2 N) across nodes);
all-gather and reduce-scatter are rings (n-1 steps) on NCCL and gloo alike, and gloo's
all-reduce too (hwprofiles.algorithms).
The bus bandwidth of a group comes from where it sits (simulator.cost.layout): inside a node the
GPU's NVLink/NVSwitch (or PCIe) link, or the node's own fit of that collective where calibrate
measured one (gloo's collectives differ in speed: NodeProfile.collectives); across nodes the
node's NICs shared by the groups that leave the node at the same time, times the fall of bus
bandwidth with the nodes a ring spans (``Network.busbw_factor``, NVIDIA/nccl#1229), and never
more than the intra-node link.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hwprofiles.algorithms import Collective, latency_seconds, uses_trees
from hwprofiles.schema import ClusterSpec, NodeProfile
from simulator.cost.cache import IdentityCache
from simulator.cost.layout import GroupShape, dp_shape
from simulator.numeric import where

_NODE_LINKS = IdentityCache(64)


@dataclass(frozen=True)
class GroupLink:
    bandwidth: float  # bytes/s of bus bandwidth per rank
    latency: float  # seconds per algorithm step (across nodes, for a group that spans several)
    trees: bool = True  # latency-bound collectives run as trees (NCCL; gloo: rings only)
    per_collective: tuple[tuple[str, float, float], ...] = ()  # (name, bytes/s, latency): own fits inside a node
    nodes: int = 1  # nodes the group spans
    intra_latency: float = 0.0  # seconds per step inside a node, for a group that spans several
    call_wait: float = 0.0  # seconds once per call: the busy ranks' sync wait (:func:`sync_wait`)
    bus_wait: float = 0.0  # seconds per bus byte more, issued after computing (:func:`sync_bus_wait`)

    def figures(self, collective: str) -> tuple[float, float]:
        """(bus bytes/s, per-step latency) of ``collective`` (hwprofiles.schema.CollectiveName); a
        call issued after computing moves each bus byte :attr:`bus_wait` slower: 1 / (1/B + w)."""
        bw, lat = self._own(collective)
        return (1.0 / (1.0 / bw + self.bus_wait), lat) if self.bus_wait else (bw, lat)

    def _own(self, collective: str) -> tuple[float, float]:
        """(bus bytes/s, per-step latency) of ``collective`` back to back: its own fit, else the link's."""
        for name, bw, lat in self.per_collective:
            if name == collective:
                return bw, lat
        return self.bandwidth, self.latency

    def latency_seconds(self, collective: str, n: int) -> float:
        """The latency terms of ``collective`` over the group's ``n`` ranks: its steps inside and
        across nodes at their per-step latencies (hwprofiles.algorithms.latency_split), and once
        the call's :attr:`call_wait`."""
        lat = self.figures(collective)[1]
        intra = lat if self.nodes <= 1 else self.intra_latency
        return latency_seconds(n, self.nodes, collective, self.trees, intra, lat) + (self.call_wait if n > 1 else 0.0)


def node_link(cluster: ClusterSpec) -> GroupLink:
    """The link of a group inside one node, with the node's per-collective fits when calibrated
    (cached per node: every size of a sweep holds the same node object)."""
    return _NODE_LINKS.get_or_make((cluster.node,), None, lambda: _node_link(cluster.node))


def _node_link(node: NodeProfile) -> GroupLink:
    fits = tuple((name, *node.intra_figures(name)) for name in sorted(node.collectives or ()))
    return GroupLink(node.intra_node.bytes_per_s, node.intra_node.latency_s, uses_trees(node.backend), fits)


def group_link(cluster: ClusterSpec, shape: GroupShape) -> GroupLink:
    """Bus bandwidth and per-step latency of a group placed as ``shape`` on ``cluster``."""
    node = cluster.node
    intra = node.intra_node
    trees = uses_trees(node.backend)
    if shape.nodes <= 1:
        return node_link(cluster)
    if node.nic is None or node.nics_per_node == 0:
        raise ValueError(f"node {node.name} has no NICs but the group spans {shape.nodes} nodes")
    inter = node.nics_per_node * node.nic.bytes_per_s / shape.concurrent * cluster.network.busbw_factor(shape.nodes)
    bw = min(inter, intra.bytes_per_s) if shape.per_node > 1 else min(inter, node.nic.bytes_per_s * node.nics_per_node)
    lat = node.nic.latency_s + cluster.network.switch_latency_us * 1e-6 * (
        1 if cluster.network.topology == "single-switch" else 3
    )
    return GroupLink(bw, max(lat, intra.latency_s), trees, nodes=shape.nodes, intra_latency=intra.latency_s)


def in_pass_wait(cluster: ClusterSpec) -> float:
    """Extra latency of each message step of a collective or send issued inside a forward or
    backward pass, while the node's other ranks compute: on a node whose CPU ranks outnumber
    the cores, a rank woken by a message waits for a core (NodeProfile.busy_latency_us, measured
    by calibrate); 0 elsewhere."""
    return cluster.node.busy_latency_s(cluster.gpus_per_node)


def sync_wait(cluster: ClusterSpec) -> float:
    """Extra seconds of every blocking collective or message that a node's ranks issue after
    computing, once per call: the ranks arrive apart (the jitter of a shared host's cores) and
    a rank blocked in it is woken (NodeProfile.sync_wait_us, measured by calibrate on CPU hosts
    for ranks with a core each: a scalar all-reduce after a short compute burst against the
    same all-reduces back to back); 0 on a GPU node, where the host runs ahead of the kernels."""
    return cluster.node.sync_wait_s(cluster.gpus_per_node)


def sync_bus_wait(cluster: ClusterSpec) -> float:
    """Extra seconds per bus byte of every blocking collective or message that a node's ranks
    issue after computing, beyond :func:`sync_wait` (NodeProfile.sync_bus_us_per_MB, measured by
    calibrate on CPU hosts: a 1 MiB all-reduce after each compute burst against the fastest loop
    of the same back to back, less the scalar's wait, per bus byte); 0 where not measured."""
    return cluster.node.sync_bus_s_per_byte(cluster.gpus_per_node)


def sync_link(cluster: ClusterSpec, shape: GroupShape) -> GroupLink:
    """:func:`group_link` for a collective issued between computations: inside one node each
    call pays :func:`sync_wait` once and each bus byte :func:`sync_bus_wait`."""
    link = group_link(cluster, shape)
    if shape.nodes > 1:
        return link
    wait, per_byte = sync_wait(cluster), sync_bus_wait(cluster)
    return dataclasses.replace(link, call_wait=wait, bus_wait=per_byte) if wait or per_byte else link


def in_pass_link(cluster: ClusterSpec, shape: GroupShape) -> GroupLink:
    """:func:`sync_link` for a collective inside a pass (tensor-parallel all-reduces): every
    step pays :func:`in_pass_wait` more when the group sits in one node."""
    link = sync_link(cluster, shape)
    wait = in_pass_wait(cluster) if shape.nodes <= 1 else 0.0
    if not wait:
        return link
    return dataclasses.replace(
        link,
        latency=link.latency + wait,
        per_collective=tuple((name, bw, lat + wait) for name, bw, lat in link.per_collective),
    )


def dp_link(cluster: ClusterSpec, t: int, d: int) -> GroupLink:
    """The link of a plan's data-parallel groups (d ranks, t apart: layout.dp_shape). Their
    gradient collectives run between the ranks' computations (DDP's buckets inside the backward,
    the reduction after each rank's last backward), so on a node whose ranks outnumber its cores
    each step pays the busy-core wait (:func:`in_pass_link`), as the sharded states' do
    (simulator.cost.zero3.shard_links)."""
    return in_pass_link(cluster, dp_shape(t, d, cluster.gpus_per_node))


def ring_seconds(collective: Collective, size_bytes: Any, n: Any, bandwidth: Any, latency_s: Any) -> Any:
    """The alpha-beta time of ``collective`` (module docstring) over ``n`` ranks:
        k (n-1)/n * S / B + latency_s,  k = 2 for an all-reduce, 1 for an all-gather or reduce-scatter,
    ``latency_s`` its latency steps times the per-step latency; 0 with one rank or nothing to move.
    Numbers or arrays alike (simulator.numeric): the batch estimate prices its plans' groups
    with it, from the figures of their links."""
    k = 2 if collective == Collective.ALL_REDUCE else 1
    return where((n > 1) & (size_bytes > 0), k * (n - 1) / n * size_bytes / bandwidth + latency_s, 0.0)


def _ring(collective: Collective, size_bytes: float, n: int, link: GroupLink) -> float:
    """:func:`ring_seconds` of ``collective`` on ``link``'s figures for it."""
    return ring_seconds(collective, size_bytes, n, link.figures(collective)[0], link.latency_seconds(collective, n))


def all_reduce_time(size_bytes: float, n: int, link: GroupLink) -> float:
    """All-reduce of a ``size_bytes`` buffer: 2(n-1)/n * S / B + latency steps * a."""
    return _ring(Collective.ALL_REDUCE, size_bytes, n, link)


def all_gather_time(size_bytes: float, n: int, link: GroupLink) -> float:
    """All-gather where ``size_bytes`` is the full (gathered) buffer."""
    return _ring(Collective.ALL_GATHER, size_bytes, n, link)


def reduce_scatter_time(size_bytes: float, n: int, link: GroupLink) -> float:
    """Reduce-scatter where ``size_bytes`` is the full (input) buffer."""
    return _ring(Collective.REDUCE_SCATTER, size_bytes, n, link)


def collective_time(op: Collective, size_bytes: float, n: int, link: GroupLink) -> float:
    """Time of ``op`` (all-reduce, all-gather or reduce-scatter) over the group's ``link``."""
    if op == Collective.ALL_REDUCE:
        return all_reduce_time(size_bytes, n, link)
    if op == Collective.ALL_GATHER:
        return all_gather_time(size_bytes, n, link)
    if op == Collective.REDUCE_SCATTER:
        return reduce_scatter_time(size_bytes, n, link)
    raise ValueError(f"no closed form for a group {op}")


def p2p_time(size_bytes: float, bandwidth: float, latency: float) -> float:
    """One point-to-point message: S / B + a."""
    return size_bytes / bandwidth + latency if size_bytes > 0 else 0.0
