"""simulator.cost.memory: ZeRO model states, activations, in-flight microbatches, buffers.

Expected numbers come from the ZeRO paper (published.yaml) or are derived by hand in the
comments (Korthikanti et al. 2022 for activations; Narayanan et al. 2021 for pipelines).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.cost import boundary, memory, state_bytes
from simulator.cost.phase_memory import gradients_late, phase_transient, weight_copies_saved
from simulator.cost.stage_memory import stage_peak
from simulator.model_files import load_model
from simulator.specs import ModelSpec


def sig3(x: float) -> float:
    """x rounded to 3 significant figures."""
    return float(f"{x:.3g}")


# ----------------------------------------------------------------------------- ZeRO


def test_zero_figures_of_published_yaml_to_3_significant_figures(published):
    rows = published["zero_model_state_memory"]
    assert {r["stage"] for r in rows} == {0, 1, 2, 3}
    for r in rows:
        # PyYAML (YAML 1.1) reads "7.5e9" as a string: it wants "7.5e+9"
        got = memory.model_state_bytes(float(r["params"]), r["dp"], r["stage"]).total / 1e9
        assert sig3(got) == pytest.approx(r["GB"], rel=0, abs=1e-9), (r, got)


def test_zero_stages_by_hand():
    psi, d = 7.5e9, 64
    # stage 0: 2 + 2 + 12 bytes per parameter
    s0 = memory.model_state_bytes(psi, d, 0)
    assert (s0.params, s0.grads, s0.optimizer) == (2 * psi, 2 * psi, 12 * psi)
    # stage 1: 4 psi + 12 psi / d = 30e9 + 1.40625e9
    assert memory.model_state_bytes(psi, d, 1).total == pytest.approx(31.40625e9)
    # stage 2: 2 psi + 14 psi / d = 15e9 + 1.640625e9
    s2 = memory.model_state_bytes(psi, d, 2)
    assert (s2.params, s2.grads, s2.optimizer) == (2 * psi, pytest.approx(2 * psi / d), pytest.approx(12 * psi / d))
    assert s2.total == pytest.approx(16.640625e9)
    # stage 3: 16 psi / d
    assert memory.model_state_bytes(psi, d, 3).total == pytest.approx(1.875e9)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_with_one_replica_is_plain_mixed_precision_adam(stage):
    assert memory.model_state_bytes(1e9, 1, stage).total == pytest.approx(16e9)


def test_zero_claims_on_32gb_v100(published):
    """ZeRO section 5 claims about model states on 32 GB devices (GB = 1e9 bytes)."""
    assert any("7.5B / 14B / 128B" in c for c in published["zero_claims"])
    cap = 32e9
    assert memory.model_state_bytes(7.5e9, 64, 1).total <= cap
    assert memory.model_state_bytes(14e9, 64, 2).total <= cap  # 28 + 3.0625 GB
    assert memory.model_state_bytes(128e9, 64, 3).total <= cap  # exactly 32 GB
    assert memory.model_state_bytes(1e12, 1024, 3).total <= cap  # 15.6 GB
    # ... and each stage's limit is a real limit: the next stage's model does not fit
    assert memory.model_state_bytes(14e9, 64, 1).total > cap
    assert memory.model_state_bytes(128e9, 64, 2).total > cap
    assert memory.model_state_bytes(2.5e9, 1, 0).total > cap  # plain DP: 16 bytes/param


def test_optimizer_bytes_parameter_k():
    s = memory.model_state_bytes(1e9, 4, 1, k=8)
    assert s.optimizer == pytest.approx(2e9) and s.params == 2e9 and s.grads == 2e9


def test_offload_keeps_no_optimizer_state_on_gpu():
    s1 = memory.model_state_bytes(1e9, 8, 1, "cpu")
    assert (s1.params, s1.grads, s1.optimizer) == (2e9, 0.0, 0.0)
    s2 = memory.model_state_bytes(1e9, 8, 2, "cpu")
    assert s2.total == 2e9
    s3 = memory.model_state_bytes(1e9, 8, 3, "nvme")
    assert s3.total == 0.0


def test_program_state_bytes_by_hand():
    """autoplan's program: fp32 parameters and gradients (4, 4) and Adam's moments (8); its ZeRO-1
    adds a full fp32 flat buffer (with the gradients: 8) and, sharded, a master copy, its gradient
    and the moments (16): 12 + 16/d bytes per parameter on each of d ranks (Megatron: 4 + 12/d)."""
    assert state_bytes.program_state_bytes("fp32-params", 2, 0) == (4, 4, 8)
    assert state_bytes.program_state_bytes("fp32-params", 2, 3) == (4, 4, 8)
    pb, gb, k = state_bytes.program_state_bytes("fp32-params", 2, 1)
    assert memory.model_state_bytes(1.0, 8, 1, "none", pb, gb, k).total == 12 + 16 / 8
    assert state_bytes.program_state_bytes("mixed", 2, 1) == state_bytes.state_bytes_per_param(2) == (2, 2, 12)


def test_state_bytes_per_param():
    assert state_bytes.state_bytes_per_param(2) == (2, 2, 12)
    assert state_bytes.state_bytes_per_param(4) == (4, 4, 8)
    s = memory.model_state_bytes(1e6, 1, 0, "none", *state_bytes.state_bytes_per_param(4))
    assert s.total == 16e6


# ----------------------------------------------------------------------- activations


def _model(s, h, a, **kw) -> ModelSpec:
    kw.setdefault("attention", "materialized")  # Korthikanti et al.'s forms keep the s x s scores
    return ModelSpec(num_layers=2, hidden_size=h, num_attention_heads=a, vocab_size=1000, seq_length=s, **kw)


TINY = _model(64, 128, 4)  # s=64, h=128, a=4
GPT3 = _model(2048, 12288, 96)  # s=2048, h=12288, a=96
MID = _model(1024, 4096, 32)  # s=1024, h=4096, a=32
# (model, b, t, sp, ckpt, bytes): sbh * factor, factor from Korthikanti et al. 2022 eqs. 2-5
ACTIVATION_POINTS = [
    # s*b*h = 64*2*128 = 16384; 34 + 5*4*64/128 = 44
    (TINY, 2, 1, 0, "none", 16384 * 44),  # 720,896
    (TINY, 2, 1, 0, "selective", 16384 * 34),  # 557,056
    (TINY, 2, 1, 0, "full", 16384 * 2),  # 32,768
    # s*b*h = 2048*12288 = 25,165,824; no SP: 10 + 24/8 + 5*96*2048/(12288*8) = 23
    (GPT3, 1, 8, 0, "none", 25165824 * 23),  # 578,813,952
    (GPT3, 1, 8, 0, "selective", 25165824 * 13),  # 10 + 3
    (GPT3, 1, 8, 0, "full", 25165824 * 2),
    # SP: (34 + 5*96*2048/12288)/8 = (34 + 80)/8 = 14.25
    (GPT3, 1, 8, 1, "none", 358612992),  # 25,165,824 * 14.25
    (GPT3, 1, 8, 1, "selective", 106954752),  # 25,165,824 * 34/8
    (GPT3, 1, 8, 1, "full", 6291456),  # 25,165,824 * 2/8
    # s*b*h = 1024*4*4096 = 16,777,216; 10 + 24/4 + 5*32*1024/(4096*4) = 26
    (MID, 4, 4, 0, "none", 16777216 * 26),  # 436,207,616
    (MID, 4, 2, 1, "none", 16777216 * (34 + 40) // 2),  # 5*32*1024/4096 = 40
]


@pytest.mark.parametrize("model,b,t,sp,ckpt,expected", ACTIVATION_POINTS)
def test_activation_bytes_hand_derived(model, b, t, sp, ckpt, expected):
    assert memory.activation_bytes_per_layer(model, b, t, bool(sp), ckpt, 2) == pytest.approx(expected, rel=1e-12)


def test_activation_gqa_swiglu_by_term():
    """Llama-2-70B-like layer (GQA 8 KV heads, SwiGLU), s=4096, b=1, t=8 with SP, fp16.
    replicated: (4*2 + 2)*s*b*h/t             = 10 * 33,554,432 / 8        = 41,943,040
    split:      2*s*b*(2h + 2kv + 3f)/t       = 8192*(16384+2048+86016)/8  = 106,954,752
    scores:     (2*2 + 1)*a*s^2*b/t           = 5*64*4096^2/8              = 671,088,640
    """
    m = _model(4096, 8192, 64, num_query_groups=8, ffn_hidden_size=28672, activation="swiglu")
    assert m.kv_size == 1024
    got = memory.activation_bytes_per_layer(m, 1, 8, True, "none", 2)
    assert got == 41943040 + 106954752 + 671088640
    assert memory.activation_bytes_per_layer(m, 1, 8, True, "selective", 2) == 41943040 + 106954752
    assert memory.activation_bytes_per_layer(m, 1, 8, True, "full", 2) == 2 * 33554432 / 8


def test_activation_fp32():
    """e = 4 (CPU runs), tiny: (4*4+2)*sbh + 4*s*b*(2h+2h+8h) + (2*4+1)*a*s^2*b
    = 18*16384 + 4*128*1536 + 9*4*64*64*2 = 294,912 + 786,432 + 294,912."""
    assert memory.activation_bytes_per_layer(TINY, 2, 1, False, "none", 4) == 294912 + 786432 + 294912


def test_activation_korthikanti_closed_forms_over_a_grid():
    for s, h, a in [(512, 1024, 16), (2048, 12288, 96), (4096, 8192, 64)]:
        m = _model(s, h, a)
        for b in (1, 3):
            sbh = s * b * h
            for t in (1, 2, 4, 8):
                no_sp = sbh * (10 + 24 / t + 5 * a * s / (h * t))
                with_sp = sbh * (34 + 5 * a * s / h) / t
                assert memory.activation_bytes_per_layer(m, b, t, False, "none") == pytest.approx(no_sp, rel=1e-12)
                if t > 1:
                    assert memory.activation_bytes_per_layer(m, b, t, True, "none") == pytest.approx(with_sp, rel=1e-12)
                if t == 1:
                    assert no_sp == pytest.approx(sbh * (34 + 5 * a * s / h))


# --------------------------------------------------------------------- in-flight


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_gpipe_holds_all_microbatches(stage):
    assert memory.in_flight_microbatches("gpipe", stage, 4, 8) == 8
    assert memory.in_flight_microbatches("gpipe", stage, 4, 2) == 2


def test_1f1b_in_flight():
    assert [memory.in_flight_microbatches("1f1b", i, 4, 8) for i in range(4)] == [4, 3, 2, 1]
    assert [memory.in_flight_microbatches("1f1b", i, 4, 2) for i in range(4)] == [2, 2, 2, 1]
    assert memory.in_flight_microbatches("1f1b", 0, 1, 16) == 1


def test_interleaved_in_flight():
    # Megatron-LM interleaved schedule, p=4, v=2: stage 0 runs (4-0-1)*2 + (2-1)*4 = 10 warm-up
    # chunk-forwards plus one: 11 chunks of half a stage = 5.5 stage-microbatches.
    assert memory.in_flight_microbatches("interleaved", 0, 4, 8, 2) == 5.5
    # last stage: 0 + 4 warm-up + 1 = 5 chunks = 2.5
    assert memory.in_flight_microbatches("interleaved", 3, 4, 8, 2) == 2.5
    # m = p: every one of the m*v = 8 chunk-forwards runs before the first backward
    assert memory.in_flight_microbatches("interleaved", 0, 4, 4, 2) == 4.0
    # v = 1 is plain 1F1B
    assert memory.in_flight_microbatches("interleaved", 0, 4, 8, 1) == 4


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 4), (8, 3), (16, 2)])
def test_interleaved_first_stage_matches_korthikanti(p, v):
    """Korthikanti et al. 2022, section 4.2.3: with interleaving the first stage holds
    p * (1 + (p-1)/(p*v)) microbatches' worth of its layers (m large)."""
    got = memory.in_flight_microbatches("interleaved", 0, p, 64 * p, v)
    assert got == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert got > memory.in_flight_microbatches("1f1b", 0, p, 64 * p)


# ------------------------------------------------------------------------- buffers


def test_buffers():
    # logits + fp32 softmax: b*s*V/t*(e+4) = 2048*51200/8*6
    m = ModelSpec(
        num_layers=96,
        hidden_size=12288,
        num_attention_heads=96,
        vocab_size=51200,
        seq_length=2048,
        attention="materialized",
    )
    logits = memory.logits_elements(m, 1, 8)
    assert logits == 2048 * 51200 // 8
    assert memory.kept_logits_bytes(logits, "fp32", 2) == 2048 * 51200 // 8 * 6
    assert memory.loss_transient_bytes(logits, "fp32", 2) == (0.0, 0.0)  # the gradient over the softmax
    # F.cross_entropy(logits.float()): the fp32 log-softmax output kept per in-flight microbatch (4 B,
    # measured 4.0 on an H100), the fp32 copy beside it in the forward (10.0 at its peak) and the
    # incoming and outgoing gradient in the backward (12.0)
    assert memory.kept_logits_bytes(logits, "torch", 2) == 2048 * 51200 // 8 * 4
    assert memory.loss_transient_bytes(logits, "torch", 2) == (2048 * 51200 // 8 * 6, 2048 * 51200 // 8 * 8)
    assert memory.kept_logits_bytes(logits, "torch", 2, inflight=3) == 2048 * 51200 // 8 * 3 * 4
    assert memory.kept_logits_bytes(logits, "fp32", 2, inflight=3) == 2048 * 51200 // 8 * 3 * 6
    assert memory.kept_logits_bytes(logits, "fused", 2) == 2048 * 51200 // 8 * 2  # the bf16 logits alone
    assert memory.logits_bytes_per_element("fp32", 4) == (8.0, 0.0, 0.0)  # fp32 logits and softmax (CPU runs)
    # autoplan's program at t > 1 (autoplan.runtime.vocab_parallel): bf16 logits, their fp32 copy and the
    # shifted copy kept as the softmax (2 + 4 + 4 at the forward's peak), the gradient cast back (2);
    # fp32 logits on CPU: no copy, no cast
    assert memory.logits_bytes_per_element("split", 2) == (4.0, 6.0, 2.0)
    assert memory.logits_bytes_per_element("split", 4) == (4.0, 4.0, 0.0)
    # DeepSpeed's AutoTP gathers the 8 ranks' logits to the whole vocabulary: torch's loss on 8x the elements
    assert memory.logits_elements(m, 1, 8, loss="gathered") == 2048 * 51200
    assert memory.logits_bytes_per_element("gathered", 2) == memory.logits_bytes_per_element("torch", 2)
    assert memory.zero3_working_set_bytes(1e6, 2) == 4e6  # two layers of bf16
    assert memory.zero3_working_set_bytes(1e6, 4) == 8e6  # fp32 on a CPU run
    assert memory.gradient_bucket_bytes(1e6) == 2e6  # small model: all its gradients
    assert memory.gradient_bucket_bytes(1e9) == 50e6  # two 25 MB buckets


def test_a_steps_phases_do_not_hold_their_transients_at_once():
    # forward's end: 10 GB of weight copies and the loss forward's 6; loss backward: the 4 GB of copies
    # the backward keeps and its 8; recompute: 4 + 3. The forward's end is the largest, all buffers.
    assert phase_transient(10.0, 4.0, 6.0, 8.0, 3.0) == (0.0, 16.0)
    # a recompute larger than the loss backward and than the forward's end: its share is activations
    assert phase_transient(2.0, 2.0, 1.0, 1.0, 5.0) == (5.0, 2.0)
    # no copies and Megatron's loss (no transient): the recompute alone, as before the phases
    assert phase_transient(0.0, 0.0, 0.0, 0.0, 3.0) == (3.0, 0.0)
    act, buf = phase_transient(*(np.array(x) for x in ([10.0, 2.0], [4.0, 2.0], [6.0, 1.0], [8.0, 1.0], [3.0, 5.0])))
    assert act.tolist() == [0.0, 5.0] and buf.tolist() == [16.0, 2.0]


def test_one_microbatchs_gradients_never_meet_its_activations():
    states = memory.ModelStates(params=7.0, grads=7.0, optimizer=14.0)
    # the program with m = 1 on one unsharded stage: 20 of activations and 9 of logits before the
    # gradients exist, the 7 of gradients after them: the peak holds the 29
    late = stage_peak(states, 20.0, 0.5, 9.0, 0.0, (0.0, 0.0), late_grads=True)
    assert (late.grads, late.activations, late.buffers, late.total) == (0.0, 20.0, 9.5, 7.0 + 14.0 + 29.5)
    # activations smaller than the gradients: the backward's end holds the gradients alone
    small = stage_peak(states, 3.0, 0.5, 1.0, 0.0, (0.0, 0.0), late_grads=True)
    assert (small.grads, small.activations, small.buffers) == (7.0, 0.0, 0.5)
    assert stage_peak(states, 20.0, 0.5, 9.0, 0.0, (0.0, 0.0)).total == 7.0 + 7.0 + 14.0 + 29.5
    assert gradients_late(True, 1, 1, 1, 0) and not gradients_late(True, 2, 1, 1, 0)
    assert not gradients_late(True, 1, 1, 2, 0) and not gradients_late(False, 1, 1, 1, 0)
    assert gradients_late(True, np.array([1, 1, 2]), 1, 1, np.array([0, 1, 0])).tolist() == [True, False, False]


def test_pytorch_ddp_holds_a_bucket_copy_of_every_gradient():
    # two 25 MB buckets in flight, capped by the gradients; PyTorch DDP (no gradient_as_bucket_view)
    # keeps every bucket: 1e9 fp32 gradients once more
    assert memory.gradient_bucket_bytes(1e9, 25e6, 4) == 50e6
    assert memory.gradient_bucket_bytes(1e9, 25e6, 4, every_bucket=True) == 4e9
    assert memory.gradient_bucket_bytes(np.array([1e6, 1e9]), 25e6, 4, np.array([False, True])).tolist() == [4e6, 4e9]


def test_the_programs_ddp_plans_price_every_bucket():
    from autoplan.runtime.support import program_job
    from hwprofiles.load import load_cluster
    from simulator.analytic import estimate
    from simulator.job import Job
    from simulator.model_files import load_model
    from simulator.plan import parse_plan

    model, cluster = load_model("llama2-7b"), load_cluster("dgx-a100-80gb")
    plan, _ = parse_plan("t=1,p=1,d=8,mb=1,zero=0,ckpt=full", model, 8, 64)
    job = program_job(Job(model, cluster, plan, 64))
    assert job.runtime.dp_buckets == "all"
    two = dataclasses.replace(job, runtime=dataclasses.replace(job.runtime, dp_buckets="in-flight"))
    psi = 6.74e9  # Llama 2 7B, 32,000-token vocabulary untied
    extra = estimate(job).memory_breakdown["buffers"] - estimate(two).memory_breakdown["buffers"]
    assert extra == pytest.approx(4 * psi - 2 * 25e6, rel=0.01)  # every fp32 gradient, less the two buckets


def test_a_fully_recomputed_layer_keeps_no_weight_copy_without_a_pipeline():
    # 2 bytes per parameter of a 10e9-parameter stage, 4e9 of them in fully recomputed layers
    assert weight_copies_saved(2.0, 10e9, 4e9, False) == 12e9
    assert weight_copies_saved(2.0, 10e9, 4e9, True) == 20e9  # autocast spans the pipeline schedule


@pytest.mark.parametrize("schedule", ["1f1b", "zbh1"])
def test_one_chunk_occupancy_stops_growing_at_2p(schedule):
    """memory.chunk_occupancy replays 1F1B's and ZB-H1's first 2p microbatches for any longer run:
    the same as replaying the whole run, for m up to 6p, and GPipe's whole run (m, its count)."""
    for p in (2, 3, 4, 5, 8):
        for m in range(2 * p, 6 * p + 1):
            for s in range(p):
                got = memory.chunk_occupancy(schedule, s, p, m)
                assert got == memory.replayed_occupancy(schedule, s, p, m) == ((p - s,),), (p, m, s)
    assert memory.chunk_occupancy("gpipe", 0, 4, 24) == ((24,),)


@pytest.mark.parametrize("schedule", ["1f1b", "zbh1", "gpipe"])
def test_one_chunk_occupancy_is_the_in_flight_count(schedule):
    """With one chunk per device chunk_occupancy gives in_flight_microbatches' count without a
    replay: the one vector the replay reaches, for every m (fewer microbatches than stages too)."""
    for p in (1, 2, 3, 5, 8):
        for m in range(1, 3 * p + 2):
            for s in range(p):
                assert memory.chunk_occupancy(schedule, s, p, m) == memory.replayed_occupancy(schedule, s, p, m)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_occupancy_stops_growing_at_2p(p, v):
    """memory.chunk_occupancy replays the interleaved schedule's first 2p microbatches for any
    longer run (m a multiple of p): the same as replaying the whole run, for m up to 6p."""
    for m in range(2 * p, 6 * p + 1, p):
        for s in range(p):
            got = memory.chunk_occupancy("interleaved", s, p, m, v)
            assert got == memory.replayed_occupancy("interleaved", s, p, m, v), (m, s)


def test_boundary_activation_bytes_by_hand():
    """GPT-3 175B, one microbatch of 2048 tokens, bf16: 1 x 2048 x 12288 x 2 = 50,331,648 bytes
    cross each pipeline boundary (before the TP split)."""
    assert boundary.boundary_activation_bytes(load_model("gpt3-175b"), 1, 2) == 50_331_648
    assert boundary.boundary_activation_bytes(load_model("gpt3-175b"), 4, 2) == 4 * 50_331_648
