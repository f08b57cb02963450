"""simulator.cost.layout: Megatron rank order and the shapes of TP / DP / PP groups on nodes."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from simulator.cost import layout
from simulator.cost.layout import GroupShape


def test_rank_order_tp_fastest_then_dp_then_pp():
    # t=2, d=3, p=2: ranks 0,1 = (pp0, dp0, tp0/1); 2,3 = dp1; ...; 6 = (pp1, dp0, tp0)
    assert layout.rank_of(0, 0, 1, t=2, d=3) == 1
    assert layout.rank_of(0, 1, 0, t=2, d=3) == 2
    assert layout.rank_of(0, 2, 1, t=2, d=3) == 5
    assert layout.rank_of(1, 0, 0, t=2, d=3) == 6
    assert layout.rank_of(1, 2, 1, t=2, d=3) == 11


@pytest.mark.parametrize("t,d,p", [(1, 1, 1), (2, 3, 2), (8, 4, 3), (4, 1, 5)])
def test_rank_of_is_a_bijection(t, d, p):
    ranks = [layout.rank_of(pp, dp, tp, t, d) for pp in range(p) for dp in range(d) for tp in range(t)]
    assert sorted(ranks) == list(range(t * d * p))


def test_shapes_by_hand():
    assert layout.tp_shape(1, 8) == GroupShape(1, 1, 1, 1)
    assert layout.tp_shape(8, 8) == GroupShape(8, 8, 1, 1)  # one NVSwitch domain
    assert layout.tp_shape(4, 8) == GroupShape(4, 4, 1, 1)
    assert layout.tp_shape(16, 8) == GroupShape(16, 8, 2, 1)  # TP across two nodes
    assert layout.dp_shape(8, 16, 8) == GroupShape(16, 1, 16, 8)  # one member per node, 8 groups per node
    assert layout.dp_shape(2, 16, 8) == GroupShape(16, 4, 4, 2)
    assert layout.dp_shape(1, 4, 8) == GroupShape(4, 4, 1, 1)  # a small DP group inside a node
    assert layout.dp_shape(16, 4, 8) == GroupShape(4, 1, 4, 8)


def _brute_force(kind: str, t: int, d: int, p: int, gpn: int) -> GroupShape:
    """Place every rank with rank_of and measure the real groups: the one spanning the most
    nodes (then with the most members on one node), and the most groups of that kind that
    leave one node at the same time."""
    if kind == "tp":
        groups = [[layout.rank_of(pp, dp, tp, t, d) for tp in range(t)] for pp in range(p) for dp in range(d)]
    else:
        groups = [[layout.rank_of(pp, dp, tp, t, d) for dp in range(d)] for pp in range(p) for tp in range(t)]
    size = len(groups[0])
    if size == 1:
        return GroupShape(1, 1, 1, 1)
    worst, leaving = (1, 1), Counter()
    for g in groups:
        on = Counter(r // gpn for r in g)
        worst = max(worst, (len(on), max(on.values())))
        if len(on) > 1:
            leaving.update(on.keys())
    return GroupShape(size, worst[1], worst[0], max(leaving.values()) if leaving else 1)


# t and gpus_per_node powers of two, as on every GPU server: groups align with node boundaries
ALIGNED = [
    (t, d, p, gpn) for t, d, p, gpn in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8, 32), (1, 2, 4), (4, 8, 16))
]
# sizes that do not line up with 8-GPU nodes (t = 3, 6, 12 divide 96 heads): some groups straddle nodes
MISALIGNED = [
    (3, 8, 1, 8),
    (6, 4, 1, 8),
    (12, 4, 1, 8),
    (12, 2, 1, 8),
    (1, 12, 2, 8),
    (6, 4, 2, 8),
    (3, 16, 1, 8),
    (24, 2, 1, 8),
    (2, 12, 1, 8),
    (6, 12, 2, 8),
]


@pytest.mark.parametrize("t,d,p,gpn", ALIGNED + MISALIGNED)
def test_group_shapes_match_the_placement(t, d, p, gpn):
    assert layout.tp_shape(t, gpn) == _brute_force("tp", t, d, p, gpn)
    assert layout.dp_shape(t, d, gpn) == _brute_force("dp", t, d, p, gpn)


def test_a_tp_group_that_straddles_nodes_is_not_an_nvswitch_group():
    """t=6 on 8-GPU nodes: ranks 6..11 form a TP group split 2 + 4 over two nodes."""
    shape = layout.tp_shape(6, 8)
    assert shape.nodes == 2 and shape.per_node == 4


@pytest.mark.parametrize(
    "t,d,p,gpn",
    [(2, 2, 2, 8), (8, 1, 2, 8), (1, 8, 2, 8), (1, 4, 2, 8), (4, 4, 4, 8), (8, 8, 16, 8), (1, 1, 8, 16), (2, 2, 1, 8)],
)
def test_pp_crosses_nodes_matches_the_placement(t, d, p, gpn):
    crosses = any(
        layout.rank_of(pp, dp, tp, t, d) // gpn != layout.rank_of(pp + 1, dp, tp, t, d) // gpn
        for pp in range(p - 1)
        for dp in range(d)
        for tp in range(t)
    )
    assert layout.pp_crosses_nodes(t, p, d, gpn) == crosses
