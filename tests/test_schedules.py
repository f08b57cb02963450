"""simulator.cost.schedules: every pass once, forward before backward, in-flight microbatches."""

from __future__ import annotations

import pytest

from simulator.cost.memory import in_flight_microbatches
from simulator.cost.schedules import chunk_rank, device_order, global_chunk, rank_chunks


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
    assert global_chunk("interleaved", 1, 0, 2) == 2


def _torch_zbv_order(p: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """torch.distributed.pipelining's own ZB-V pass order of ``rank`` (its
    ``_calculate_single_rank_operations``, called on a stand-in for the schedule object):
    (kind, microbatch, global stage), idle slots dropped, its input-gradient 'I' as 'B'."""
    import types

    from torch.distributed.pipelining.schedules import BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, ScheduleZBVZeroBubble

    fake = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    ops = ScheduleZBVZeroBubble._calculate_single_rank_operations(fake, rank)
    kinds = {FORWARD: "F", BACKWARD_INPUT: "B", BACKWARD_WEIGHT: "W"}
    return [(kinds[a.computation_type], a.microbatch_index, a.stage_index) for a in ops if a is not None]


@pytest.mark.parametrize("p,m", [(2, 4), (2, 1), (4, 8), (4, 3), (4, 16), (3, 7)])
def test_zero_bubble_v_is_torchs_order(p, m):
    """ZB-V's order is torch's ScheduleZBVZeroBubble's, pass for pass, and its V placement
    (rank s holds chunks s and 2p-1-s) the one torch's stage-to-rank mapping uses."""
    pytest.importorskip("torch")
    assert rank_chunks("zbv", p, 2) == [[s, 2 * p - 1 - s] for s in range(p)]
    assert [chunk_rank("zbv", j, p) for j in range(2 * p)] == [*range(p), *reversed(range(p))]
    for s in range(p):
        ours = [(op.kind, op.mb, global_chunk("zbv", op.chunk, s, p)) for op in device_order("zbv", p, m, 2, s)]
        assert ours == _torch_zbv_order(p, m, s)
        assert sorted(ours) == sorted((k, mb, j) for k in "FBW" for mb in range(m) for j in rank_chunks("zbv", p, 2)[s])
