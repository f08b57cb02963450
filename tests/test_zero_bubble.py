"""schedule=zbh1 (issue 18): the zero-bubble order torch runs, its bubble and memory by hand, the
analytic and DES models agreeing, and the exports that cannot run it naming the change."""

from __future__ import annotations

import pytest
from conftest import analytic_and_des
from torch.distributed.pipelining.schedules import _ComputationType, _get_1f1b_rank_ops

from autoplan.emit.deepspeed import export_deepspeed
from autoplan.emit.megatron import export_megatron
from autoplan.runtime.config import TrainSettings
from hwprofiles.errors import PlanError
from hwprofiles.load import load_cluster
from simulator.analytic.pipeline import pipeline_bubble
from simulator.cost.memory import weight_grad_input_bytes, weight_grads_pending
from simulator.cost.schedules import device_order
from simulator.job import Job
from simulator.plan import parse_plan
from simulator.specs import load_model

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


def test_weight_gradient_inputs_by_hand():
    """GPT-3 (f = 4h), t = 8 with SP, b = 1, 2 bytes: QKV and fc1 inputs 2*s*h/8, proj and fc2
    inputs s*(h + 4h)/8: 7*s*h/8 elements, 2 bytes each."""
    s, h = GPT.seq_length, GPT.hidden_size
    assert weight_grad_input_bytes(GPT, 1, 8, True, 2) == pytest.approx(2 * 7 * s * h / 8)


def test_bubble_by_hand():
    """Four equal stages, c = F + B + W = 3 + 4 + 2 per microbatch: 1F1B idles (p - 1) c = 27,
    ZB-H1 (p - 1)(F + B - W) = 15 (Qi et al. 2024); never below 0."""
    assert pipeline_bubble(9.0, 36.0, "1f1b", 1) == 27.0
    assert pipeline_bubble(9.0, 36.0, "zbh1", 1, 2.0, 8.0) == 15.0
    assert pipeline_bubble(9.0, 36.0, "zbh1", 1, 5.0, 20.0) == 0.0


def test_analytic_and_des_agree_and_zbh1_beats_1f1b():
    one_f_one_b, _ = analytic_and_des(GPT, A100, "t=8,p=16,mb=1,zero=1,sp=1,ckpt=full", 128, 0.01, 0.01)
    zero_bubble, _ = analytic_and_des(GPT, A100, "t=8,p=16,mb=1,zero=1,sp=1,ckpt=full,schedule=zbh1", 128, 0.01, 0.01)
    assert zero_bubble.step_time < 0.97 * one_f_one_b.step_time  # the W passes fill the bubble
    assert zero_bubble.peak_memory > one_f_one_b.peak_memory  # later stages keep the deferred W's inputs


def test_bad_input_and_exports():
    with pytest.raises(PlanError, match="schedule=zbh1 \\(zero bubble\\) needs p >= 2"):
        parse_plan("t=8,schedule=zbh1", GPT, 128, 128)
    with pytest.raises(PlanError, match="schedule=zbh1 with zero=3 is not modelled"):
        parse_plan("t=8,p=4,zero=3,schedule=zbh1", GPT, 128, 128)
    plan, _ = parse_plan("t=8,p=16,mb=1,zero=1,sp=1,schedule=zbh1", GPT, 128, 128)
    job = Job(GPT, A100, plan, 128)
    for export in (export_megatron(job, TrainSettings()), export_deepspeed(job, TrainSettings())):
        assert export.written is not None and export.written.schedule == "1f1b"
        assert any(c.key == "schedule" and c.planned == "zbh1" for c in export.changes)
