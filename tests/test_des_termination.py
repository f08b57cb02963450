"""The DES always ends (issue 31, "Hangs"): flows finish within a tolerance relative to their size
and to the clock (simulator.des.flow.finish_tolerance), the engine never re-arms a network
event at the same instant, and the commands reported to hang answer. Every command here runs
in a subprocess killed with its workers after a deadline (bounded_cli), and every engine run
under pytest-timeout, so a hang fails the test."""

from __future__ import annotations

import json
import math

import pytest
from bounded_cli import run_bounded

from simulator.des.engine import Engine, FlowSpec, Phase
from simulator.des.flow import Flow, finish_tolerance
from simulator.des.network import Network

# A link of 2**33 bytes/s (8.6 GB/s) at simulated time 2**20 s (12 days), where the clock's
# grid is ulp(2**20) = 2**(20 - 52) = 2**-32 s: the link moves 2**33 * 2**-32 = 2 bytes per ulp.
RATE = 2.0**33
LATE = 2.0**20


# ---------------------------------------------------------------- the network's tolerance


def test_tolerance_is_relative_to_size_at_small_times():
    # at t = 1 s, ulp = 2**-52 s: the clock term is 2 * 2**33 * 2**-52 = 2**-18 = 3.8e-6 bytes,
    # below 1e-9 * 1e6 + 1e-3 = 0.002 bytes
    assert finish_tolerance(1e6, RATE, 1.0) == pytest.approx(0.002, rel=1e-12)


def test_tolerance_is_relative_to_the_clock_at_large_times():
    # at t = 2**20 s the clock term is 2 ulps * 2 bytes per ulp = 4 bytes, exactly
    assert math.ulp(LATE) == 2.0**-32
    assert finish_tolerance(1e6, RATE, LATE) == 4.0


def test_the_reported_leftover_is_finished():
    """The flow that hung the llama3-70b cp=8 step: 2.488 bytes left of 1,497,395,200 at
    t = 65,536.67 s on a 360 GB/s link. Its rest, 2.488 / 360e9 = 6.9e-12 s, is under half
    of ulp(t) = 2**-36 s = 1.46e-11 s, so t + rest == t; the size term alone is 1.4984 bytes,
    the clock term 2 * 360e9 * 2**-36 = 10.48 bytes."""
    now, size, rate, left = 65536.67183046909, 1497395200.0, 360e9, 2.488349437713623
    assert now + left / rate == now  # the clock cannot move this flow on
    assert left > 1e-9 * size + 1e-3
    assert finish_tolerance(size, rate, now) == pytest.approx(10.477378964424133, rel=1e-12)
    assert left <= finish_tolerance(size, rate, now)


def test_a_flow_due_within_the_clocks_rounding_ends_now():
    """0.9 bytes at 2**33 B/s take 1.05e-10 s, under half an ulp of 2**20 s (1.16e-10 s): the
    network's next completion is the present instant, and the flow must be over then."""
    net = Network([RATE], record=False)
    net.add(Flow(0.9, (0,), (1.0,), owner=7), LATE)
    assert net.allocate(LATE) == LATE
    assert net.pop_finished(LATE) == [7]
    assert net.flows == []


def test_a_flow_beyond_the_tolerance_waits_for_its_end():
    net = Network([RATE], record=False)
    net.add(Flow(100.0, (0,), (1.0,), owner=3), LATE)
    nxt = net.allocate(LATE)
    assert nxt > LATE
    assert net.pop_finished(LATE) == []
    assert net.pop_finished(nxt) == [3]


# ---------------------------------------------------------------- the engine


@pytest.mark.timeout(10)
def test_engine_ends_a_transfer_at_a_late_clock():
    """A task of 2**20 s, then a transfer of 0.9 bytes: it ends at 2**20 s (before the
    tolerance, the engine re-armed its network event at 2**20 s forever)."""
    eng = Engine(Network([RATE], record=False))
    s = eng.add_stream("s")
    wait = eng.task(s, LATE, "wait")
    send = eng.transfer(s, [Phase((FlowSpec((0,), (1.0,), 0.9),), 0.0)], "send", deps=[wait])
    assert eng.run() == LATE
    assert eng.end[send] == LATE


class _FrozenNetwork(Network):
    """A network whose next completion is always now: the engine must stop, not spin."""

    def allocate(self, now: float) -> float:
        super().allocate(now)
        return now


@pytest.mark.timeout(10)
def test_engine_refuses_to_re_arm_at_the_same_instant():
    """Two transfers on one link, so the network's allocation rates them (a flow alone on its
    links ends by its own event: Network.add)."""
    eng = Engine(_FrozenNetwork([1.0], record=False))
    for name in ("a", "b"):
        eng.transfer(eng.add_stream(name), [Phase((FlowSpec((0,), (1.0,), 10.0),), 0.0)], "send")
    with pytest.raises(RuntimeError, match="no progress"):
        eng.run()


# ---------------------------------------------------------------- the reported commands


def test_plan_at_seq_131072_answers():
    """No answer in 90 s before: the DES of t=4,cp=2,...,offload=cpu,prec=fp8 stuck at 2048 s."""
    proc = run_bounded(
        "plan",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "1",
        "--global-batch",
        "256",
        "--seq-len",
        "131072",
        "--json",
        deadline_s=90,
    )
    assert proc.returncode == 0, proc.stderr
    best = json.loads(proc.stdout)["best"]
    assert best["fidelity"] == "des" and best["fits"]


def _simulate_cp8(global_batch: int) -> dict:
    proc = run_bounded(
        "simulate",
        "--model",
        "llama3-70b",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "1",
        "--global-batch",
        str(global_batch),
        "--seq-len",
        "524288",
        "--plan",
        "cp=8,zero=3",
        "--json",
        deadline_s=60,
    )
    assert proc.returncode == 3, proc.stderr  # 1.6 TiB per GPU: it does not fit, and says so
    return json.loads(proc.stdout)


def test_simulate_cp8_at_seq_524288_answers_past_2_16_simulated_seconds():
    """The DES once ran past 150 s when a step crossed 2**16 s of simulated time (ulp 1.46e-11 s;
    then at global batch 64). Global batch 256 crosses it (about 84,000 s with the H100's measured
    attention, a few seconds to simulate); its step is four times the batch-64 step: one
    pipeline, four times the microbatches."""
    b64, b256 = _simulate_cp8(64), _simulate_cp8(256)
    assert b64["fidelity"] == b256["fidelity"] == "des"
    assert b256["step_time_s"] > 2.0**16
    assert b256["step_time_s"] == pytest.approx(4 * b64["step_time_s"], rel=0.01)


@pytest.mark.parametrize(
    "args",
    [
        ("plan", "--nodes", "2"),
        ("simulate", "--nodes", "2", "--plan", "t=2,cp=8,zero=3,ckpt=full,sp=1"),
    ],
    ids=["plan", "simulate"],
)
def test_tiny_at_seq_1e8_ends_within_seconds(args):
    """A seq of 10**8 with the tiny model: a result or a one-line error within about 10 s (no
    answer in 60 s before; its DES stuck at 2,474 s). The deadline allows for a loaded machine."""
    cmd, *rest = args
    proc = run_bounded(
        cmd,
        "--model",
        "tiny",
        "--cluster",
        "dgx-h100",
        "--global-batch",
        "8",
        "--seq-len",
        "100000000",
        *rest,
        "--json",
        deadline_s=30,
    )
    assert proc.returncode in (0, 2, 3), proc.stderr
    assert "Traceback" not in proc.stderr
    if proc.stdout.strip():
        out = json.loads(proc.stdout)
        assert math.isfinite((out["best"] if cmd == "plan" else out)["step_time_s"])
    else:
        assert len(proc.stderr.strip().splitlines()) == 1
