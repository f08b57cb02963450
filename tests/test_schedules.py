"""simulator.cost.schedules: every pass once, forward before backward, in-flight microbatches."""

from __future__ import annotations

import pytest

from simulator.cost.memory import in_flight_microbatches
from simulator.cost.schedules import device_order, global_chunk


def max_in_flight(order) -> int:
    live, peak = 0, 0
    for op in order:
        live += 1 if op.kind == "F" else -1
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(
    "schedule,p,m,v",
    [
        ("gpipe", 4, 8, 1),
        ("1f1b", 4, 8, 1),
        ("1f1b", 8, 3, 1),
        ("interleaved", 4, 8, 2),
        ("interleaved", 4, 4, 3),
        ("interleaved", 2, 6, 4),
    ],
)
def test_each_pass_once_forward_first(schedule, p, m, v):
    for s in range(p):
        order = device_order(schedule, p, m, v, s)
        assert len(order) == 2 * m * v
        seen = set()
        for op in order:
            key = (op.kind, op.mb, op.chunk)
            assert key not in seen
            seen.add(key)
            if op.kind == "B":
                assert ("F", op.mb, op.chunk) in seen
        assert {(mb, c) for _, mb, c in seen} == {(mb, c) for mb in range(m) for c in range(v)}


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (8, 4), (1, 5)])
def test_in_flight_microbatches(p, m):
    for s in range(p):
        assert max_in_flight(device_order("1f1b", p, m, 1, s)) == min(p - s, m)
        assert max_in_flight(device_order("gpipe", p, m, 1, s)) == m


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (8, 16, 2)])
def test_interleaved_in_flight_matches_memory_model(p, m, v):
    for s in range(p):
        chunks = max_in_flight(device_order("interleaved", p, m, v, s))
        assert chunks / v == pytest.approx(in_flight_microbatches("interleaved", s, p, m, v))


def test_interleaved_chunk_order_follows_megatron():
    order = device_order("interleaved", 2, 4, 2, 0)
    fwd = [(op.mb, op.chunk) for op in order if op.kind == "F"]
    # (k % (p*v)) // p is the chunk, (k // (p*v)) * p + k % p the microbatch
    assert fwd == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    assert global_chunk(1, 0, 2) == 2
