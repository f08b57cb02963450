"""simulator.des.network: max-min fair sharing of links by concurrent flows."""

from __future__ import annotations

import pytest

from simulator.des.engine import Engine, FlowSpec, Phase
from simulator.des.network import Network, fair_rates


def test_two_flows_on_one_link_each_get_half():
    assert fair_rates([100.0], [(0,), (0,)]) == pytest.approx([50.0, 50.0])


def test_max_min_fair_allocation():
    # A crosses links 0 and 1; B only 0; C only 1. Link 0 = 10, link 1 = 4:
    # link 1 fills first (A = C = 2), then B takes the rest of link 0 (8).
    rates = fair_rates([10.0, 4.0], [(0, 1), (0,), (1,)])
    assert rates == pytest.approx([2.0, 8.0, 2.0])


def test_weights_stand_for_identical_copies():
    # a flow standing for 3 copies on a link shares it with 1 other flow: each gets 1/4
    rates = fair_rates([100.0], [(0,), (0,)], weights=[(3.0,), (1.0,)])
    assert rates == pytest.approx([25.0, 25.0])


def test_finishing_flow_frees_bandwidth():
    """Small flow S and large flow L start together on one link of bandwidth B: the small one
    ends at 2S/B, the large one at (S + L)/B."""
    net = Network([10.0])
    eng = Engine(net)
    a, b = eng.add_stream("a"), eng.add_stream("b")
    small = eng.transfer(a, [Phase((FlowSpec((0,), (1.0,), 20.0),), 0.0)], "x")
    large = eng.transfer(b, [Phase((FlowSpec((0,), (1.0,), 60.0),), 0.0)], "y")
    eng.run()
    assert eng.end[small] == pytest.approx(4.0)
    assert eng.end[large] == pytest.approx(8.0)
    assert net.utilization(8.0)[0] == pytest.approx(1.0)


def test_late_flow_shares_from_when_it_starts():
    net = Network([10.0])
    eng = Engine(net)
    a, b = eng.add_stream("a"), eng.add_stream("b")
    first = eng.transfer(a, [Phase((FlowSpec((0,), (1.0,), 50.0),), 0.0)], "x")
    gate = eng.task(b, 1.0, "wait")
    second = eng.transfer(b, [Phase((FlowSpec((0,), (1.0,), 10.0),), 0.0)], "y", deps=[gate])
    eng.run()
    # 10 bytes alone in [0, 1], then 5 B/s each: second needs 2 s, first has 30 left at t=3
    assert eng.end[second] == pytest.approx(3.0)
    assert eng.end[first] == pytest.approx(6.0)


def test_link_series_recorded_for_traces():
    net = Network([10.0, 10.0], record=True)
    eng = Engine(net)
    s = eng.add_stream("s")
    eng.transfer(s, [Phase((FlowSpec((0, 1), (1.0, 2.0), 10.0),), 0.0)], "x")
    eng.run()
    assert net.series[0] == [(0.0, pytest.approx(0.5)), (pytest.approx(2.0), 0.0)]
    assert net.series[1][0][1] == pytest.approx(1.0)


def test_refilling_only_the_flows_linked_to_a_change_gives_the_rates_of_a_full_fill():
    """Network.allocate fills again only the flows that share links, through others, with a
    flow that entered or left; a network that records (every flow filled) gets the same rates
    to the bit, over random routes, weights, arrivals and departures."""
    import random

    from simulator.des.flow import Flow

    rng = random.Random(7)
    caps = [rng.choice([25e9, 50e9, 100e9, 300e9]) for _ in range(40)]
    partial, full = Network(caps, record=False), Network(caps, record=True)
    live: list[tuple[Flow, Flow]] = []
    for step in range(400):
        if live and rng.random() < 0.45:  # a flow ends (its bytes set to none left)
            a, b = live.pop(rng.randrange(len(live)))
            a.rem = b.rem = 0.0
            assert partial.pop_finished(partial.last) == full.pop_finished(full.last) == [a.owner]
        else:
            links = tuple(rng.sample(range(40), rng.randint(1, 5)))
            if rng.random() < 0.1:
                links += links[:1]  # a route crossing a link twice
            weights = tuple(float(rng.choice([1, 2, 8])) for _ in links)
            a, b = Flow(1e12, links, weights, step), Flow(1e12, links, weights, step)
            partial.add(a, partial.last)
            full.add(b, full.last)
            live.append((a, b))
        if live:
            partial.allocate(partial.last)
            full.allocate(full.last)
            assert [a.rate for a, _ in live] == [b.rate for _, b in live], step
    assert partial.reallocations == full.reallocations > 300


def _transfers_on_one_link(record: bool, starts: list[float], size: float = 30.0) -> tuple[Network, Engine, list[int]]:
    """Transfers of ``size`` bytes on one link of 10 B/s, each on its own stream, starting at ``starts``."""
    net = Network([10.0], record=record)
    eng = Engine(net)
    ids = []
    for i, at in enumerate(starts):
        s = eng.add_stream(f"s{i}")
        deps = [eng.task(s, at, "wait")] if at > 0 else []
        ids.append(eng.transfer(s, [Phase((FlowSpec((0,), (1.0,), size),), 0.0)], "x", deps=deps))
    eng.run()
    return net, eng, ids


def test_a_flow_alone_on_its_links_ends_at_its_solo_rate():
    net, eng, (x,) = _transfers_on_one_link(False, [0.5])
    assert eng.end[x] == 0.5 + 30.0 / 10.0
    assert net.link_bytes == {0: 30.0}
    assert net.users == [0] and not net.flows


@pytest.mark.parametrize("record", [False, True])
def test_flows_joining_one_running_alone_share_the_link_from_when_they_start(record):
    """The first runs alone (Network.add, not recorded) until the second joins at 1 s, the third
    at 2 s: 10 B alone, then 5 B/s each for 1 s, then 10/3 B/s each; every end as max-min gives."""
    _, eng, (a, b, c) = _transfers_on_one_link(record, [0.0, 1.0, 2.0])
    # at 2 s: a has 15 left, b 25, c 30; at 10/3 B/s each a ends at 6.5 s; then 5 B/s each: b (10
    # left) ends at 8.5 s, c (15 left) has 5 left then, alone at 10 B/s: 9 s
    assert eng.end[a] == pytest.approx(6.5)
    assert eng.end[b] == pytest.approx(8.5)
    assert eng.end[c] == pytest.approx(9.0)


def test_three_flows_starting_together_on_one_link_share_it():
    """Only the first of flows starting at one instant can start alone; the second makes it
    share, and the third and later find the link taken (each gets a third: 9 s for 30 B each)."""
    _, eng, ids = _transfers_on_one_link(False, [0.0, 0.0, 0.0])
    assert [eng.end[x] for x in ids] == pytest.approx([9.0, 9.0, 9.0])
