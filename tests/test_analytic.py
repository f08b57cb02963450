"""simulator.analytic: pipeline bubbles with free communication, FLOP accounting, memory."""

from __future__ import annotations

import pytest

from hwprofiles import load_cluster
from hwprofiles.load import cluster_from_mapping, load_gpu
from simulator.analytic import estimate, memory_only
from simulator.analytic.pipeline import ScheduleKind, pipeline_time
from simulator.cost import memory, params
from simulator.cost.workload import megatron_flops_with_recompute, model_flops_per_iteration
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan
from simulator.result import MEMORY_KEYS, TIME_KEYS
from simulator.specs import ModelSpec

FAST = 1e9  # GB/s: communication that costs nothing next to compute


def ideal_cluster(nodes: int = 2, gpus_per_node: int = 4):
    """A100 nodes joined by links of absurd bandwidth and zero latency, with no per-kernel host
    time (which would make the embedding and head stages unequal to the others)."""
    link = {"kind": "nvswitch", "bandwidth_GBps": FAST, "latency_us": 0}
    gpu = load_gpu("a100-sxm4-80gb").model_copy(update={"kernel_launch_us": 0.0})
    node = {
        "name": "ideal",
        "gpu": gpu,
        "gpus_per_node": gpus_per_node,
        "intra_node": link,
        "pcie": {"kind": "pcie", "bandwidth_GBps": FAST},
        "nics_per_node": gpus_per_node,
        "nic": {"kind": "infiniband", "bandwidth_GBps": FAST, "latency_us": 0},
        "host_memory_GiB": 1024,
    }
    return cluster_from_mapping(
        {"name": "ideal", "nodes": nodes, "node": node, "network": {"switch_latency_us": 0}}, "ideal"
    )


# 32 equal layers; a tiny vocabulary keeps the embedding and LM head (the only unequal
# stage work) below 0.3% of a stage
UNIFORM = ModelSpec(
    name="uniform", num_layers=32, hidden_size=4096, num_attention_heads=32, vocab_size=128, seq_length=1024
)


def test_pipeline_time_formula():
    c = 0.1
    for p, m in [(1, 1), (4, 8), (8, 64), (8, 4)]:
        t = pipeline_time(c, p * c, m, ScheduleKind.of("1f1b", 1), 1)
        assert t == pytest.approx((m + p - 1) * c)
        assert (t - m * c) / (m * c) == pytest.approx((p - 1) / m)
        assert pipeline_time(c, p * c, m, ScheduleKind.of("gpipe", 1), 1) == t
    for p, v, m in [(4, 2, 8), (8, 4, 16)]:
        t = pipeline_time(c, p * c, m, ScheduleKind.of("interleaved", v), v)
        assert (t - m * c) / (m * c) == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize(
    "p,m,schedule", [(4, 8, "1f1b"), (4, 8, "gpipe"), (2, 2, "1f1b"), (8, 4, "1f1b"), (8, 32, "1f1b"), (2, 16, "gpipe")]
)
def test_bubble_is_p_minus_1_over_m_without_communication(p, m, schedule):
    c = ideal_cluster()
    d = 8 // p
    r = estimate(Job.make(UNIFORM, c, Plan(t=1, p=p, d=d, mb=1, schedule=schedule), m * d))
    assert r.bubble_fraction == pytest.approx((p - 1) / m, rel=5e-3)
    tb = r.time_breakdown
    assert tb["pp_comm"] + tb["dp_comm"] + tb["tp_comm"] < 1e-6 * r.step_time


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (4, 4, 4), (8, 2, 16), (8, 4, 8), (2, 8, 2)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, v, m):
    c = ideal_cluster()
    d = 8 // p
    r = estimate(Job.make(UNIFORM, c, Plan(t=1, p=p, d=d, mb=1, v=v, schedule="interleaved"), m * d))
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m), rel=5e-3)


def test_no_pipeline_no_bubble():
    r = estimate(Job.make(UNIFORM, ideal_cluster(), Plan(t=1, p=1, d=8), 64))
    assert r.bubble_fraction == 0.0 and r.time_breakdown["bubble"] == pytest.approx(0.0, abs=1e-12)


def test_more_microbatches_shrink_the_bubble():
    c = load_cluster("dgx-a100-80gb", 16)
    m = load_model("gpt3-175b")
    fr = [estimate(Job.make(m, c, Plan(t=8, p=8, d=2, ckpt="full"), B)).bubble_fraction for B in (32, 128, 512)]
    assert fr[0] > fr[1] > fr[2] > 0


# ------------------------------------------------------------------- FLOPs, result


@pytest.fixture(scope="module")
def gpt3_result():
    """gpt3-175b on 128 DGX A100 nodes, B = 1536, t=8, p=16, d=8, mb=1, ckpt=full."""
    c = load_cluster("dgx-a100-80gb", 128)
    return estimate(Job.make(load_model("gpt3-175b"), c, Plan(t=8, p=16, d=8, mb=1, ckpt="full"), 1536))


def test_tflops_with_full_recompute_is_megatron_formula(gpt3_result):
    r = gpt3_result
    F = megatron_flops_with_recompute(load_model("gpt3-175b"), 1536)
    assert r.executed_flops == pytest.approx(F, rel=1e-12)
    assert r.tflops_per_gpu == pytest.approx(F / (r.step_time * 1024) / 1e12)
    assert r.mfu == pytest.approx(
        model_flops_per_iteration(load_model("gpt3-175b"), 1536) / (r.step_time * 1024 * 312e12)
    )
    assert r.mfu < r.tflops_per_gpu * 1e12 / 312e12  # recomputation is not model FLOPs
    assert 0 < r.mfu < 1


def test_time_breakdown_adds_up_to_the_step(gpt3_result):
    r = gpt3_result
    assert set(r.time_breakdown) == set(TIME_KEYS)
    assert all(v >= 0 for v in r.time_breakdown.values())
    assert sum(r.time_breakdown.values()) == pytest.approx(r.step_time, rel=1e-9)
    # full recomputation redoes one forward: a third of forward+backward's GEMM work, less with
    # flash attention, whose backward (2.5x its forward's FLOPs) is slower than the forward
    assert r.time_breakdown["compute"] / 4 < r.time_breakdown["recompute"] < r.time_breakdown["compute"] / 3


@pytest.mark.parametrize(
    "name,plan,B",
    [
        ("gpt3-175b", Plan(t=8, p=4, d=4, mb=1, v=3, schedule="interleaved", sp=1, ckpt="selective"), 64),
        ("llama2-70b", Plan(t=4, p=2, d=16, mb=2, zero=3), 128),
        ("llama2-70b", Plan(t=2, p=1, d=64, zero=2, offload="cpu"), 128),
        ("llama2-70b", Plan(t=8, p=2, d=8, zero=1, schedule="gpipe"), 64),
    ],
)
def test_breakdowns_for_other_plans(name, plan, B):
    c = load_cluster("dgx-a100-80gb", 16)
    r = estimate(Job.make(load_model(name), c, plan, B))
    assert sum(r.time_breakdown.values()) == pytest.approx(r.step_time, rel=1e-9)
    assert set(r.memory_breakdown) == set(MEMORY_KEYS)
    assert sum(r.memory_breakdown.values()) == pytest.approx(r.peak_memory, rel=1e-9)
    assert r.peak_memory == pytest.approx(memory_only(Job.make(r.job.model, c, plan, B)))


# -------------------------------------------------------------------------- memory


def test_model_states_of_the_peak_stage_follow_zero():
    """gpt3-175b, t=8, p=16: stage 0 holds 6 layers and the embedding on each TP rank."""
    model = load_model("gpt3-175b")
    psi = params.stage_params_per_rank(model, 8, 16, 6, True, False)
    c = load_cluster("dgx-a100-80gb", 128)
    for zero in (0, 1, 2, 3):
        plan = Plan(t=8, p=16, d=8, zero=zero, ckpt="full")
        r = estimate(Job.make(model, c, plan, 1536))
        stage = r.extra["peak_memory_stage"]
        assert stage == 0
        states = memory.model_state_bytes(psi, 8, zero)
        mb = r.memory_breakdown
        assert (mb["params"], mb["grads"], mb["optimizer"]) == pytest.approx(
            (states.params, states.grads, states.optimizer)
        )


def test_activations_of_stage_0_with_full_recompute(gpt3_result):
    """1F1B stage 0 of p=16 holds min(16, 192) = 16 microbatches of its 6 layers' inputs
    (2sbh each with full recompute) and one layer's full activations while it is recomputed
    (23 sbh at t=8, Korthikanti et al. 2022): 16*6*2 + 23 = 215 sbh. On top of that the first
    stage keeps the embedding's dropout mask (sbh per microbatch in Korthikanti et al. 2022,
    section 4.3); allow at most the embedding output and its mask, (2*2 + 1) sbh per microbatch."""
    sbh = 2048 * 12288
    act = gpt3_result.memory_breakdown["activations"]
    assert 215 * sbh <= act <= (215 + 16 * 5) * sbh


def test_capacity_and_fit(gpt3_result):
    gpu = load_cluster("dgx-a100-80gb").gpu
    assert gpt3_result.memory_capacity == gpu.usable_memory_bytes
    assert gpt3_result.fits
    huge = estimate(Job.make(load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", 1), Plan(t=8, p=1, d=1), 8))
    assert not huge.fits and huge.peak_memory > 16 * params.total_params(load_model("gpt3-175b")) / 8


def test_recompute_and_sp_save_memory():
    c = load_cluster("dgx-a100-80gb", 16)
    m = load_model("gpt3-175b")
    peak = {ck: memory_only(Job.make(m, c, Plan(t=8, p=8, d=2, ckpt=ck), 64)) for ck in ("none", "selective", "full")}
    assert peak["none"] > peak["selective"] > peak["full"]
    assert memory_only(Job.make(m, c, Plan(t=8, p=8, d=2, sp=1), 64)) < peak["none"]


@pytest.mark.parametrize(
    "plan",
    [
        Plan(t=2, p=1, d=4, mb=1, zero=0, ckpt="selective", schedule="gpipe"),  # GPipe's skipped recomputation
        Plan(t=4, p=1, d=2, mb=2, zero=0, ckpt="none", schedule="1f1b"),  # rounding: was -1.9e-16
    ],
)
def test_bubble_is_never_negative(plan):
    """A property test found a negative bubble fraction for each of these plans of the tiny model."""
    from hwprofiles.load import load_cluster

    job = Job.make(load_model("tiny"), load_cluster("dgx-a100-80gb", 1), plan, 8 if plan.d == 4 else 24)
    r = estimate(job)
    assert r.bubble_fraction >= 0.0
    assert r.time_breakdown["bubble"] >= 0.0
    assert sum(r.time_breakdown.values()) == pytest.approx(r.step_time, rel=1e-12)
