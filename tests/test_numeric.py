"""simulator.numeric: the helpers that let one rule take numbers or arrays, and rules written
with them giving, element by element, what they give for numbers (hand-derived figures)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hwprofiles.algorithms import Collective
from simulator import numeric
from simulator.analytic.data_parallel import last_bucket_bytes
from simulator.analytic.pipeline import ScheduleKind, pipeline_bubble
from simulator.cost import memory
from simulator.cost.collectives import ring_seconds
from simulator.cost.overlap import overlap_cost


def test_numbers_stay_python_numbers():
    assert numeric.where(True, 1.5, 2.0) == 1.5 and type(numeric.where(False, 1.5, 2.0)) is float
    assert numeric.maximum(3, 2.5) == 3 and numeric.minimum(3, 2.5) == 2.5
    assert numeric.negate(False) is True and numeric.any_of(False) is False
    assert numeric.fmod(7.5, 2.0) == 1.5
    assert type(numeric.maximum(np.float64(1.0), 2.0)) is not np.ndarray  # a numpy scalar counts as a number


def test_arrays_element_by_element():
    cond = np.array([True, False, True])
    assert numeric.where(cond, np.array([1.0, 2.0, 3.0]), 0.0).tolist() == [1.0, 0.0, 3.0]
    assert numeric.maximum(np.array([1.0, 5.0]), 2.0).tolist() == [2.0, 5.0]
    assert numeric.minimum(2.0, np.array([1.0, 5.0])).tolist() == [1.0, 2.0]
    assert numeric.negate(cond).tolist() == [False, True, False]
    assert numeric.any_of(cond) and not numeric.any_of(np.zeros(2, dtype=bool))
    assert numeric.fmod(np.array([7.5, 4.0]), 2.0).tolist() == [1.5, 0.0]


def test_overlap_cost_by_hand_both_forms():
    # C = 10, K = 4, sigma = 0.5: max(10 + 0.5 * 4, 4) - 10 = 2; K = 12: max(10 + 5, 12) - 10 = 5; K = 0: 0
    comm = [4.0, 12.0, 0.0]
    want = [2.0, 5.0, 0.0]
    assert [overlap_cost(10.0, k, 0.5) for k in comm] == want
    assert overlap_cost(10.0, np.array(comm), 0.5).tolist() == want


def test_ring_seconds_by_hand_both_forms():
    # all-reduce of 8 GB over 4 ranks at 100 GB/s with 3 us of latency steps: 2 * 3/4 * 0.08 s + 3 us
    assert ring_seconds(Collective.ALL_REDUCE, 8e9, 4, 100e9, 3e-6) == pytest.approx(0.120003)
    # all-gather: (n-1)/n S/B; one rank or nothing to move: 0
    sizes, ranks = np.array([8e9, 8e9, 0.0]), np.array([4, 1, 4])
    got = ring_seconds(Collective.ALL_GATHER, sizes, ranks, 100e9, 3e-6)
    assert got.tolist() == [ring_seconds(Collective.ALL_GATHER, s, n, 100e9, 3e-6) for s, n in zip(sizes, ranks)]
    assert got[0] == pytest.approx(0.060003) and got[1] == 0.0 and got[2] == 0.0


def test_model_states_by_hand_both_forms():
    # 1e9 parameters, 8 ranks, 2/2/12 bytes: ZeRO-1 2 + 2 + 12/8 = 5.5 GB; ZeRO-3 16/8 = 2 GB;
    # offloaded ZeRO-1: only the 2-byte parameters, 2 GB; offloaded ZeRO-3: nothing
    zero = np.array([1, 3, 1, 3])
    offloaded = np.array([False, False, True, True])
    states = memory.model_state_bytes(1e9, 8, zero, offloaded)
    assert states.total.tolist() == [5.5e9, 2e9, 2e9, 0.0]
    for i, (z, off) in enumerate(zip(zero.tolist(), ["none", "none", "cpu", "cpu"])):
        assert memory.model_state_bytes(1e9, 8, z, off).total == states.total[i]


def test_last_bucket_and_bubble_both_forms():
    grads = np.array([10e6, 60e6, 75e6])  # 25 MB buckets: all of it, the 10 MB remainder, a whole bucket
    assert last_bucket_bytes(grads).tolist() == [10e6, 10e6, 25e6]
    assert [last_bucket_bytes(g) for g in grads.tolist()] == [10e6, 10e6, 25e6]
    # worst 9, total 36 over 4 devices: 1F1B idles 27; interleaved v=2 halves it
    kinds = ScheduleKind(np.array([False, True]), np.array([False, False]), np.array([False, False]), False)
    assert pipeline_bubble(9.0, 36.0, kinds, np.array([1, 2])).tolist() == [27.0, 13.5]
    assert not math.isnan(pipeline_bubble(9.0, 36.0, ScheduleKind.of("1f1b", 1), 1))


def test_distinct_codes_are_uniques_answer_without_loading_numpy_ma() -> None:
    import subprocess
    import sys
    from pathlib import Path

    codes = np.array([3, 0, 3, 7, 0])
    assert numeric.distinct_codes(codes).tolist() == np.unique(codes).tolist() == [0, 3, 7]
    assert numeric.distinct_codes(np.array([], dtype=np.int64)).tolist() == []
    check = "import sys, numpy; from simulator.numeric import distinct_codes; distinct_codes(numpy.array([2, 0]))"
    check += "; assert 'numpy.ma' not in sys.modules"  # np.unique imports it: 10-20 ms in every search worker
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
