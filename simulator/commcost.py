"""Closed-form (alpha-beta) collective times for the analytic estimator.

Ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005), S = bytes per rank's buffer,
n = ranks, B = bus bandwidth (bytes/s), a = per-step latency:
    all-reduce:              2(n-1)/n * S / B + 2(n-1) a
    reduce-scatter, all-gather: (n-1)/n * S / B + (n-1) a
    point-to-point:          S / B + a
NCCL switches to tree (double binary tree) algorithms when latency dominates; we take the
ring bandwidth term with the smaller of the ring and tree latency terms (2*ceil(log2 n) steps);
gloo runs rings only (hwprofiles.algorithms).
The bus bandwidth of a group comes from where it sits (simulator.layout): inside a node the
GPU's NVLink/NVSwitch (or PCIe) link; across nodes the node's NICs shared by the groups
that leave the node at the same time, and never more than the intra-node link.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwprofiles.algorithms import latency_steps, uses_trees
from hwprofiles.schema import ClusterSpec
from simulator.layout import GroupShape


@dataclass(frozen=True)
class GroupLink:
    bandwidth: float    # bytes/s of bus bandwidth per rank
    latency: float      # seconds per algorithm step
    trees: bool = True  # latency-bound collectives run as trees (NCCL; gloo: rings only)


def group_link(cluster: ClusterSpec, shape: GroupShape) -> GroupLink:
    """Bus bandwidth and per-step latency of a group placed as ``shape`` on ``cluster``."""
    node = cluster.node
    intra = node.intra_node
    trees = uses_trees(node.backend)
    if shape.nodes <= 1:
        return GroupLink(intra.bytes_per_s, intra.latency_s, trees)
    if node.nic is None or node.nics_per_node == 0:
        raise ValueError(f"node {node.name} has no NICs but the group spans {shape.nodes} nodes")
    inter = node.nics_per_node * node.nic.bytes_per_s / shape.concurrent
    bw = min(inter, intra.bytes_per_s) if shape.per_node > 1 else min(inter, node.nic.bytes_per_s * node.nics_per_node)
    lat = node.nic.latency_s + cluster.network.switch_latency_us * 1e-6 * (1 if cluster.network.topology == "single-switch" else 3)
    return GroupLink(bw, max(lat, intra.latency_s), trees)


def allreduce_time(size_bytes: float, n: int, link: GroupLink) -> float:
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * size_bytes / link.bandwidth + latency_steps(n, 2 * (n - 1), link.trees) * link.latency


def allgather_time(size_bytes: float, n: int, link: GroupLink) -> float:
    """All-gather (or reduce-scatter) where ``size_bytes`` is the full (gathered) buffer."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return (n - 1) / n * size_bytes / link.bandwidth + latency_steps(n, n - 1, link.trees) * link.latency


reducescatter_time = allgather_time


def p2p_time(size_bytes: float, bandwidth: float, latency: float) -> float:
    return size_bytes / bandwidth + latency if size_bytes > 0 else 0.0
