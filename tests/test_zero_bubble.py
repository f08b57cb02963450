"""schedule=zbh1 and zbv (issue 18): the zero-bubble orders torch runs, their bubble and memory by
hand, the analytic and DES models agreeing, and the exports that cannot run them naming the change."""

from __future__ import annotations

import pytest
from conftest import analytic_and_des
from torch.distributed.pipelining.schedules import _ComputationType, _get_1f1b_rank_ops

from autoplan.emit.deepspeed import export_deepspeed
from autoplan.emit.megatron import export_megatron
from autoplan.runtime.config import TrainSettings
from hwprofiles.errors import PlanError
from hwprofiles.load import load_cluster
from simulator.analytic.pipeline import ScheduleKind, pipeline_bubble, weight_fill
from simulator.cost.memory import chunk_occupancy, replayed_occupancy, weight_grad_input_bytes, weight_grads_pending
from simulator.cost.schedules import device_order
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan

GPT = load_model("gpt3-175b")
A100 = load_cluster("dgx-a100-80gb", 16)
KIND = {_ComputationType.FORWARD: "F", _ComputationType.BACKWARD_INPUT: "B", _ComputationType.BACKWARD_WEIGHT: "W"}


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 3), (4, 8), (8, 16), (3, 12)])
def test_order_is_torchs_zero_bubble_order(p, m):
    """ScheduleInterleavedZeroBubble with one stage per rank: warm-up p - s - 1 forwards, then the
    1F1B core with W trailing B by s microbatches (torch's _get_1f1b_rank_ops(enable_zero_bubble))."""
    for s in range(p):
        warm = min(p - s - 1, m)
        stage = s  # one local stage per rank: its global index is the rank

        def index(_step: int, stage: int = stage) -> int:
            return stage

        torch_ops = _get_1f1b_rank_ops(1, p, warm, m - warm, warm, s, index, index, s, True)
        want = [(KIND[a.computation_type], a.microbatch_index) for a in torch_ops if a is not None]
        got = [(op.kind, op.mb) for op in device_order("zbh1", p, m, 1, s)]
        assert got == want
        assert sorted(got) == sorted((k, i) for k in "FBW" for i in range(m))  # every pass once


def test_pending_weight_gradients_by_hand():
    """Stage s defers W by s microbatches: at its peak (p - s forwards in flight) it owes s of them;
    with m < p fewer (p = 4, m = 2: stage 3 runs F0 B0 F1, owing W0 at F1's start)."""
    assert [weight_grads_pending("zbh1", s, 4, 8) for s in range(4)] == [0, 1, 2, 3]
    assert [weight_grads_pending("zbh1", s, 4, 2) for s in range(4)] == [0, 0, 0, 1]
    assert weight_grads_pending("1f1b", 3, 4, 8) == 0


def _replayed_pending(p: int, m: int, s: int) -> int:
    """The W's stage s owes at its peak of in-flight forwards (the most owed among the forwards
    that reach that peak), counted along its ZB-H1 pass order."""
    inflight = owed = 0
    peak = (0, 0)
    for op in device_order("zbh1", p, m, 1, s):
        if op.kind == "F":
            inflight += 1
            peak = max(peak, (inflight, owed))
        elif op.kind == "B":
            inflight, owed = inflight - 1, owed + 1
        else:
            owed -= 1
    return peak[1]


def test_pending_weight_gradients_closed_form_equals_the_replay():
    """memory.weight_grads_pending's closed form, max(0, s - max(0, p - m)), against the pass order."""
    for p in range(2, 17):
        for m in range(1, 41):
            assert [weight_grads_pending("zbh1", s, p, m) for s in range(p)] == [
                _replayed_pending(p, m, s) for s in range(p)
            ], (p, m)


def test_weight_gradient_inputs_by_hand():
    """GPT-3 (f = 4h), t = 8 with SP, b = 1, 2 bytes: QKV and fc1 inputs 2*s*h/8, proj and fc2
    inputs s*(h + 4h)/8: 7*s*h/8 elements, 2 bytes each."""
    s, h = GPT.seq_length, GPT.hidden_size
    assert weight_grad_input_bytes(GPT, 1, 8, True, 2) == pytest.approx(2 * 7 * s * h / 8)


def test_bubble_by_hand():
    """Four equal stages, c = F + B + W = 3 + 4 + 2 per microbatch: 1F1B idles (p - 1) c = 27,
    ZB-H1 (p - 1)(B + max(0, F - W)) = 3 * 5 = 15 (= Qi et al. 2024's (p - 1)(F + B - W) when
    W <= F); with W = 4 > F = 1 (B = 4): (p - 1) B = 12; never below 0."""
    assert pipeline_bubble(9.0, 36.0, ScheduleKind.of("1f1b", 1), 1) == 27.0
    assert (
        pipeline_bubble(
            9.0, 36.0, ScheduleKind.of("zbh1", 1), 1, weight_fill(False, 2.0, 3.0), 4 * weight_fill(False, 2.0, 3.0)
        )
        == 15.0
    )
    assert (
        pipeline_bubble(
            9.0, 36.0, ScheduleKind.of("zbh1", 1), 1, weight_fill(False, 4.0, 1.0), 4 * weight_fill(False, 4.0, 1.0)
        )
        == 12.0
    )
    assert pipeline_bubble(9.0, 36.0, ScheduleKind.of("zbh1", 1), 1, 9.0, 36.0) == 0.0


def _replayed_bubble(schedule: str, p: int, m: int, f: float, b: float, w: float) -> float:
    """Makespan minus m (F + B + W) of equal stages running torch's order (device_order) with
    free communication: each pass starts when its rank is free and its input is ready (forward
    of chunk j after j - 1's, input gradient after j + 1's or the chunk's own forward, W after
    its B); chunks of a ZB-V rank take half the stage's time."""
    from simulator.cost.schedules import global_chunk

    v = 2 if schedule == "zbv" else 1
    orders = [device_order(schedule, p, m, v, s) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    clock, nxt = [0.0] * p, [0] * p
    length = {"F": f / v, "B": b / v, "W": w / v}
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            while nxt[s] < len(orders[s]):
                op = orders[s][nxt[s]]
                j = global_chunk(schedule, op.chunk, s, p)
                dep = {"F": ("F", op.mb, j - 1) if j else None, "W": ("B", op.mb, j)}.get(
                    op.kind, ("B", op.mb, j + 1) if j < p * v - 1 else ("F", op.mb, j)
                )
                if dep is not None and dep not in done:
                    break
                clock[s] = max(clock[s], done[dep] if dep else 0.0) + length[op.kind]
                done[(op.kind, op.mb, j)] = clock[s]
                nxt[s] += 1
    return max(clock) - m * (f + b + w)


@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (7.1, 10.1, 9.4), (3, 4, 2), (1, 2, 1), (2, 1, 1), (1, 1, 2)])
def test_zero_bubble_rule_is_torchs_order_replayed(f, b, w):
    """weight_fill's rules are what torch's orders give when replayed: ZB-H1 (p - 1)(B + max(0, F - W)),
    ZB-V (p - 1) B / 2 while F and W are at most B (the regime of transformer layers: the DES's
    GPT-3 layers give F : B : W = 7.1 : 10.1 : 9.4)."""
    for p in (2, 4, 8):
        c = f + b + w
        rule = pipeline_bubble(
            c, p * c, ScheduleKind.of("zbh1", 1), 1, weight_fill(False, w, f), p * weight_fill(False, w, f)
        )
        assert _replayed_bubble("zbh1", p, 4 * p, f, b, w) == pytest.approx(rule)
        if f <= b and w <= b:
            zbv = pipeline_bubble(
                c, p * c, ScheduleKind.of("zbv", 2), 2, weight_fill(True, w, f), p * weight_fill(True, w, f)
            )
            assert _replayed_bubble("zbv", p, 4 * p, f, b, w) == pytest.approx(zbv)


def test_analytic_and_des_agree_and_zbh1_beats_1f1b():
    one_f_one_b, _ = analytic_and_des(GPT, A100, "t=8,p=16,mb=1,zero=1,sp=1,ckpt=full", 128, 0.01, 0.01)
    zero_bubble, _ = analytic_and_des(GPT, A100, "t=8,p=16,mb=1,zero=1,sp=1,ckpt=full,schedule=zbh1", 128, 0.01, 0.01)
    assert zero_bubble.step_time < 0.97 * one_f_one_b.step_time  # the W passes fill the bubble
    assert zero_bubble.peak_memory > one_f_one_b.peak_memory  # later stages keep the deferred W's inputs


@pytest.mark.parametrize("schedule", ["zbh1", "zbv"])
def test_bad_input_and_exports(schedule):
    with pytest.raises(PlanError, match=f"schedule={schedule} \\(zero bubble\\) needs p >= 2"):
        parse_plan(f"t=8,schedule={schedule}", GPT, 128, 128)
    with pytest.raises(PlanError, match=f"schedule={schedule} with zero=3 is not modelled"):
        parse_plan(f"t=8,p=4,zero=3,schedule={schedule}", GPT, 128, 128)
    plan, _ = parse_plan(f"t=8,p=16,mb=1,zero=1,sp=1,schedule={schedule}", GPT, 128, 128)
    job = Job(GPT, A100, plan, 128)
    megatron, deepspeed = export_megatron(job, TrainSettings()), export_deepspeed(job, TrainSettings())
    # Megatron-LM runs neither; DeepSpeed runs ZB-V's placement as DualPipeV (m = 128 >= 2p), not ZB-H1
    changed = [megatron] if schedule == "zbv" else [megatron, deepspeed]
    for export in changed:
        assert export.written is not None and (export.written.schedule, export.written.v) == ("1f1b", 1)
        assert any(c.key == "schedule" and c.planned == schedule for c in export.changes)
        assert export.written.chunk_layers(96) == (6,) * 16  # ZB-V: each rank's two chunks as one stage
    if schedule == "zbv":
        assert deepspeed.written is not None and deepspeed.written.schedule == "zbv"
        assert not any(c.key == "schedule" for c in deepspeed.changes)


# ---------------------------------------------------------------------------------------- ZB-V


@pytest.mark.parametrize("p,m", [(2, 1), (2, 8), (4, 3), (4, 16), (8, 24)])
def test_zbv_owes_no_weight_gradient_when_a_forward_runs(p, m):
    """ZB-V runs each W right after its B until the cool-down, which has no forward: whenever a
    forward runs, no W is owed (so memory.weight_grads_pending is 0 for zbv)."""
    for s in range(p):
        owed = 0
        for op in device_order("zbv", p, m, 2, s):
            owed += {"F": 0, "B": 1, "W": -1}[op.kind]
            assert op.kind != "F" or owed == 0
        assert weight_grads_pending("zbv", s, p, m) == 0


def test_zbv_occupancy_stops_growing_at_2p():
    """memory.chunk_occupancy replays ZB-V's 2p microbatches for any longer run: the same as
    replaying the whole run, for m up to 6p."""
    for p in (2, 3, 4, 5, 8):
        for m in range(2 * p, 6 * p + 1):
            for s in range(p):
                assert chunk_occupancy("zbv", s, p, m, 2) == replayed_occupancy("zbv", s, p, m, 2), (p, m, s)


def test_zbv_bubble_by_hand():
    """ZB-V idles (p - 1) B / 2 = 3 * 4 / 2 = 6: its V fills the forwards too, its chunks are half a
    rank's layers."""
    assert (
        pipeline_bubble(
            9.0, 36.0, ScheduleKind.of("zbv", 2), 2, weight_fill(True, 2.0, 3.0), 4 * weight_fill(True, 2.0, 3.0)
        )
        == 6.0
    )
    assert pipeline_bubble(9.0, 36.0, ScheduleKind.of("zbv", 2), 2, 9.0, 36.0) == 0.0


def test_zbv_des_bubble_is_half_of_zbh1s():
    """With free communication and uniform stages the DES replays torch's two orders: ZB-V's
    idle time is about half of ZB-H1's (the ratio the analytic bubble takes), for m >= 2p."""
    from hwprofiles import load_cluster as cluster_of
    from simulator.des import simulate_des
    from simulator.des.program import DesOptions
    from simulator.plan import Plan
    from simulator.specs import ModelSpec

    model = ModelSpec(name="uniform", num_layers=24, hidden_size=512, num_attention_heads=8, vocab_size=1024,
                      seq_length=256)  # fmt: skip
    free = DesOptions(free_comm=True, skip_embedding_head=True)
    node = cluster_of("dgx-a100-80gb", 1)
    for p, m in ((2, 8), (4, 8), (4, 16)):
        idle = {}
        for schedule, v in (("zbh1", 1), ("zbv", 2)):
            plan = Plan(p=p, d=8 // p, v=v, schedule=schedule)
            r = simulate_des(Job.make(model, node, plan, m * plan.d), options=free)
            idle[schedule] = r.time_breakdown["bubble"]
        assert 0.45 < idle["zbv"] / idle["zbh1"] < 0.6, (p, m, idle)


def test_zbv_analytic_and_des_agree_and_memory():
    """The two models agree on time within 2% at 128 microbatches and 3% at 32 (the analytic bubble,
    half of ZB-H1's, is the larger: ZB-V's rank 0, the critical one with the embedding and the head,
    starts without waiting) and on memory within 2% (the head's chunk holds one microbatch)."""
    zbv, _ = analytic_and_des(GPT, A100, "t=8,p=16,mb=1,zero=1,sp=1,ckpt=full,schedule=zbv", 128, 0.02, 0.02)
    assert zbv.job.plan.v == 2  # schedule=zbv implies its two chunks per rank
    llama = load_model("llama2-7b")
    analytic_and_des(llama, load_cluster("dgx-a100-80gb", 2), "t=2,p=4,mb=1,zero=1,schedule=zbv", 64, 0.03, 0.01)


def test_zbv_needs_two_chunks_per_rank():
    with pytest.raises(PlanError, match="schedule=zbv runs two chunks per rank in a V: it needs v=2, got v=3"):
        parse_plan("t=8,p=4,v=3,schedule=zbv", GPT, 128, 128)
    with pytest.raises(PlanError, match="v=2 chunks per rank need p\\*v = 14 to divide num_layers=96"):
        parse_plan("t=8,p=7,schedule=zbv", GPT, 112, 112)
    # an explicit split in a V: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    from simulator.cost.stage import device_layers
    from simulator.plan import Plan

    plan = Plan(p=2, v=2, schedule="zbv", layers=(10, 20, 30, 36), recompute=((10, 0), (0, 0), (0, 30), (0, 0)))
    assert device_layers(plan, 96) == ([46, 50], [10, 0], [0, 30])
