"""Where each (pipeline, data, tensor) coordinate lives: Megatron-LM's rank order.

global rank = pp * (d * t) + dp * t + tp      (tensor-parallel ranks are adjacent,
                                                 Narayanan et al. 2021, section 3.3)
node = rank // gpus_per_node
So a TP group stays inside a node whenever t <= gpus_per_node, the data-parallel group of
one tensor rank strides by t, and consecutive pipeline stages are d*t ranks apart.
"""

from __future__ import annotations

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
    return pp * (d * t) + dp * t + tp


def group_shape(size: int, stride: int, gpus_per_node: int) -> GroupShape:
    """Shape of a group of ``size`` ranks spaced ``stride`` apart (stride 1: adjacent)."""
    if size <= 1:
        return GroupShape(1, 1, 1, 1)
    if stride >= gpus_per_node:
        per_node = 1
    else:
        per_node = max(1, min(size, gpus_per_node // stride))
    nodes = -(-size // per_node)
    concurrent = gpus_per_node // per_node if nodes > 1 else 1
    return GroupShape(size, per_node, nodes, concurrent)


def tp_shape(t: int, gpus_per_node: int) -> GroupShape:
    return group_shape(t, 1, gpus_per_node)


def dp_shape(t: int, d: int, gpus_per_node: int) -> GroupShape:
    return group_shape(d, t, gpus_per_node)


def pp_crosses_nodes(t: int, p: int, d: int, gpus_per_node: int) -> bool:
    """Does some pipeline boundary cross nodes? Stages are d*t ranks apart, so with p > 1 a
    boundary falls between nodes exactly when the job spans more than one node."""
    return p > 1 and p * d * t > gpus_per_node
