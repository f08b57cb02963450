"""simulator.des.engine: streams run in order, dependencies hold, ties break deterministically."""

from __future__ import annotations

import pytest

from simulator.des.engine import Engine, FlowSpec, Phase
from simulator.des.network import Network


def test_stream_runs_in_issue_order_and_streams_overlap():
    eng = Engine()
    a, b = eng.add_stream("compute"), eng.add_stream("comm")
    t1 = eng.task(a, 1.0, "F")
    t2 = eng.task(a, 2.0, "F")
    c1 = eng.task(b, 1.5, "dp", deps=[t1])  # starts when t1 ends, overlaps t2
    t3 = eng.task(a, 1.0, "B", deps=[c1])  # waits for both t2 (stream) and c1
    end = eng.run()
    assert eng.start[t2] == 1.0 and eng.end[t2] == 3.0
    assert eng.start[c1] == 1.0 and eng.end[c1] == 2.5
    assert eng.start[t3] == 3.0 and end == 4.0
    assert eng.cause[t3] == t2 and eng.cause[c1] == t1


def test_head_of_stream_blocks_later_ready_tasks():
    """A CUDA stream does not reorder: a ready task waits behind a blocked one."""
    eng = Engine()
    a, b = eng.add_stream("a"), eng.add_stream("b")
    slow = eng.task(b, 5.0, "x")
    blocked = eng.task(a, 1.0, "y", deps=[slow])
    ready = eng.task(a, 1.0, "z")
    eng.run()
    assert eng.start[blocked] == 5.0 and eng.start[ready] == 6.0


def test_ties_break_in_creation_order_and_runs_repeat():
    def build():
        eng = Engine()
        streams = [eng.add_stream(f"s{i}") for i in range(4)]
        root = eng.task(streams[0], 1.0, "r")
        kids = [eng.task(s, 1.0, "k", deps=[root]) for s in streams[1:]]
        eng.task(streams[0], 0.5, "j", deps=kids)
        eng.run()
        return eng

    e1, e2 = build(), build()
    assert e1.start == e2.start and e1.end == e2.end and e1.cause == e2.cause
    # the joining task was released by the last-created of the simultaneous finishers
    assert e1.cause[-1] == 3


def test_deadlock_is_reported():
    eng = Engine()
    s = eng.add_stream("s")
    a = eng.task(s, 1.0, "a")
    b = eng.task(s, 1.0, "b")
    eng.add_dep(a, b)  # a waits for b, which queues behind a
    with pytest.raises(RuntimeError, match="deadlock"):
        eng.run()


def test_transfer_phases_take_bytes_over_bandwidth_plus_latency():
    net = Network([10.0, 20.0])
    eng = Engine(net)
    s = eng.add_stream("comm")
    x = eng.transfer(
        s, [Phase((FlowSpec((0, 1), (1.0, 1.0), 50.0),), 0.5), Phase((FlowSpec((1,), (1.0,), 40.0),), 0.25)], "dp"
    )
    y = eng.task(s, 1.0, "after")
    eng.run()
    assert eng.end[x] == pytest.approx(50 / 10 + 0.5 + 40 / 20 + 0.25)
    assert eng.start[y] == pytest.approx(eng.end[x])
    assert net.link_bytes[0] == pytest.approx(50.0) and net.link_bytes[1] == pytest.approx(90.0)


def test_empty_transfer_is_instant():
    eng = Engine(Network([1.0]))
    s = eng.add_stream("s")
    x = eng.transfer(s, [], "pp")
    eng.run()
    assert eng.start[x] == eng.end[x] == 0.0
