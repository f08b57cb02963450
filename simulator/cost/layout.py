"""Where each (pipeline, data, tensor) coordinate lives: Megatron-LM's rank order.

global rank = pp * (d * t) + dp * t + tp      (tensor-parallel ranks are adjacent,
                                                 Narayanan et al. 2021, section 3.3)
node = rank // gpus_per_node
So a TP group stays inside a node whenever t divides gpus_per_node, the data-parallel group
of one tensor rank strides by t, and consecutive pipeline stages are d*t ranks apart.
When a group size or stride does not line up with the node size (t = 3, 6 or 12 on 8-GPU
nodes), groups differ: some straddle a node boundary; the shape is then that of the worst group.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupShape:
    """How one communication group sits on the nodes.

    size: ranks in the group; per_node: group members on one node; nodes: nodes spanned;
    concurrent: groups of the same kind that share one node's links at the same time
    (e.g. the t data-parallel groups of a node's tensor ranks all-reduce together).
    """

    size: int
    per_node: int
    nodes: int
    concurrent: int


def rank_of(pp: int, dp: int, tp: int, t: int, d: int) -> int:
    """The global rank of grid coordinate (pp, dp, tp)."""
    return pp * (d * t) + dp * t + tp


def coords_of(rank: int, t: int, d: int) -> tuple[int, int, int]:
    """(pp, dp, tp) of a global rank: the inverse of :func:`rank_of`."""
    return rank // (d * t), (rank // t) % d, rank % t


@functools.lru_cache(maxsize=4096)
def group_shape(size: int, stride: int, gpus_per_node: int) -> GroupShape:
    """Shape of a group of ``size`` ranks spaced ``stride`` apart (stride 1: adjacent).

    Groups come in blocks of ``stride`` interleaved groups covering size*stride consecutive
    ranks (TP: blocks of t; DP: blocks of d*t, one group per tensor rank)."""
    if size <= 1:
        return GroupShape(1, 1, 1, 1)
    span = size * stride
    if stride < gpus_per_node and (gpus_per_node % stride or (span % gpus_per_node and gpus_per_node % span)):
        return _worst_group_shape(size, stride, gpus_per_node)
    if stride >= gpus_per_node:
        per_node = 1
    else:
        per_node = max(1, min(size, gpus_per_node // stride))
    nodes = -(-size // per_node)
    concurrent = gpus_per_node // per_node if nodes > 1 else 1
    return GroupShape(size, per_node, nodes, concurrent)


def _worst_group_shape(size: int, stride: int, gpus_per_node: int) -> GroupShape:
    """Place every group of one period of the layout (lcm(size*stride, gpus_per_node) ranks)
    and return the group spanning the most nodes, with the most groups leaving one node at once."""
    span = size * stride
    period = span * gpus_per_node // math.gcd(span, gpus_per_node)
    worst = (1, 1)  # (nodes, per_node)
    crossing: Counter = Counter()  # node -> groups with members on it that also leave it
    for base in range(0, period, span):
        for r in range(stride):
            on = Counter((base + r + i * stride) // gpus_per_node for i in range(size))
            worst = max(worst, (len(on), max(on.values())))
            if len(on) > 1:
                crossing.update(on.keys())
    nodes, per_node = worst
    return GroupShape(size, per_node, nodes, max(crossing.values()) if crossing else 1)


def tp_shape(t: int, gpus_per_node: int) -> GroupShape:
    return group_shape(t, 1, gpus_per_node)


def dp_shape(t: int, d: int, gpus_per_node: int) -> GroupShape:
    return group_shape(d, t, gpus_per_node)


def pp_crosses_nodes(t: int, p: int, d: int, gpus_per_node: int) -> bool:
    """Does some pipeline boundary cross nodes? Stages are d*t ranks apart, so with p > 1 a
    boundary falls between nodes exactly when the job spans more than one node."""
    return p > 1 and p * d * t > gpus_per_node
