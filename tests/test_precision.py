"""prec=fp8 (issue 18): fp8 linear GEMMs at the fp8 curve, 1-byte saved linear inputs, fp8 weight
copies; every formula against a number derived by hand, the plan key's bad-input treatment, and
the three models (scalar, array, DES) agreeing on an fp8 plan."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import analytic_and_des

from autoplan import space
from autoplan.runtime.support import unsupported_reason
from autoplan.search import SearchOptions, search
from hwprofiles.errors import PlanError
from hwprofiles.load import load_cluster
from simulator.analytic import estimate
from simulator.analytic.batch import estimate_batch
from simulator.cost.block_times import block_times
from simulator.cost.memory import activation_bytes_per_layer
from simulator.cost.op import gemm
from simulator.cost.ops import backward_ops, gemm_efficiency, work_time
from simulator.cost.params import layer_params_per_rank
from simulator.cost.precision import (
    casts_every_forward,
    fp8_cast_op,
    fp8_weight_bytes,
    gathered_bytes,
    linear_input_bytes,
    weight_cast_op,
)
from simulator.cost.stage import stage_costs
from simulator.cost.workload import layer_forward_ops
from simulator.des import simulate_des
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan, parse_plan, plan_errors
from simulator.runtime_spec import OVERLAPPED
from simulator.specs import ModelSpec

H100 = load_cluster("dgx-h100", 16)
GPT = load_model("gpt3-175b")


def _curve_only(gpu):
    """``gpu`` without its measured GEMM table: its curves alone (used outside the table's grid)."""
    return gpu.model_copy(update={"gemm": gpu.gemm.model_copy(update={"table": []})})


def test_fp8_gemm_efficiency_is_the_fp8_curve():
    """0.80 * (8192/8288)^2 * 8192/8704 of 1979 TFLOP/s: 1456, where tile-lang measured 1461-1507
    on an H800 (the profile's source); k = 1024: 0.80 * (8192/8288)^2 * 1024/1536 -> 1031 (927-1129)."""
    gpu = _curve_only(H100.gpu)
    big = gemm_efficiency(gpu, 8192, 8192, 8192, "fp8")
    assert big == pytest.approx(0.80 * (8192 / 8288) ** 2 * 8192 / 8704, rel=1e-12)
    assert big * 1979 == pytest.approx(1456, abs=1)
    assert gemm_efficiency(gpu, 8192, 8192, 1024, "fp8") * 1979 == pytest.approx(1031, abs=1)
    assert gemm_efficiency(gpu, 8192, 8192, 8192) == pytest.approx(0.75 * (8192 / 8288) ** 2 * 8192 / 8240)


def test_measured_table_gives_the_measured_rate_at_its_points():
    # hwprofiles/gpus/h100-sxm5-80gb.yaml: 8192^3 measured at 786.8 (bf16) and 1442.4 (fp8) TFLOP/s
    gpu = H100.gpu
    assert gemm_efficiency(gpu, 8192, 8192, 8192) * 989.4 == pytest.approx(786.8, rel=1e-6)
    assert gemm_efficiency(gpu, 8192, 8192, 8192, "fp8") * 1979 == pytest.approx(1442.4, rel=1e-6)


def test_fp8_gemm_and_its_backward_run_at_the_fp8_peak():
    gpu = _curve_only(H100.gpu)
    op = gemm("fc1", 8192, 8192, 8192, 2, dtype="fp8")
    flops = 2 * 8192**3
    assert work_time(op, gpu) == pytest.approx(flops / (1979e12 * gemm_efficiency(gpu, 8192, 8192, 8192, "fp8")))
    assert all(b.dtype == "fp8" for b in backward_ops(op))
    bf16 = gemm("fc1", 8192, 8192, 8192, 2)
    assert work_time(bf16, gpu) / work_time(op, gpu) == pytest.approx(
        1979 * 0.80 * 8192 / 8704 / (989.4 * 0.75 * 8192 / 8240), rel=1e-9
    )


def test_only_the_four_linears_are_fp8():
    ops = layer_forward_ops(GPT, 1, 4, True, 2, "fp8")
    assert {o.name for o in ops if o.dtype == "fp8"} == {"qkv", "proj", "fc1", "fc2"}
    assert "fp8_cast" in {o.name for o in ops}
    assert not any(o.dtype for o in layer_forward_ops(GPT, 1, 4, True, 2))


def test_fp8_cast_bytes_by_hand():
    """h = 4, f = 16, kv = 4 (MHA), GELU, s = 8, b = 1, t = 1, e = 2: forward casts the proj and fc2
    inputs, 8*(4 + 16) = 160 elements at 3 bytes; backward casts and transposes the output
    gradients of QKV (12), proj (4), fc1 (16), fc2 (4) per token, 8*36 = 288 elements at 4 bytes."""
    m = ModelSpec(
        name="m", num_layers=1, hidden_size=4, num_attention_heads=1, ffn_hidden_size=16, vocab_size=8, seq_length=8
    )
    op = fp8_cast_op(m, 1, 1, 2)
    assert op.bytes == 160 * 3
    assert op.bwd_bytes == pytest.approx(288 * 4)


def test_fp8_saves_seven_sbh_of_activations_per_layer():
    """GPT-3 (MHA, f = 4h, GELU), t = 1: the linears' saved inputs (QKV and fc1: sbh each; proj: sbh;
    fc2: 4sbh) drop from 2 to 1 byte: 7*s*b*h fewer bytes; full recomputation keeps the layer input only."""
    s, h = GPT.seq_length, GPT.hidden_size
    for ckpt in ("none", "selective"):
        bf16 = activation_bytes_per_layer(GPT, 1, 1, False, ckpt, 2)
        fp8 = activation_bytes_per_layer(GPT, 1, 1, False, ckpt, 2, linear_input_bytes("fp8", 2))
        assert bf16 - fp8 == pytest.approx(7 * s * h)
    assert activation_bytes_per_layer(GPT, 1, 1, False, "full", 2, 1) == 2 * s * h
    assert linear_input_bytes("bf16", 2) == 2


def test_fp8_weight_copies():
    """2 bytes (the fp8 weight and its transpose) per parameter of the rank's layers; ZeRO-3: of
    the two gathered layers only; none in bf16."""
    assert fp8_weight_bytes(Plan(zero=1, prec="fp8"), 12, 1e6, 2) == 24e6
    assert fp8_weight_bytes(Plan(zero=3, d=8, prec="fp8"), 12, 1e6, 2) == 4e6
    assert fp8_weight_bytes(Plan(zero=1), 12, 1e6, 2) == 0.0


def test_fp8_parameters_by_hand():
    """fp8ag=1 (Megatron-LM --fp8-param-gather): a layer keeps its fp8 weight and transpose
    (2 bytes) instead of its bf16 weight and both fp8 copies (4 bytes): 2 - e = 0 beside the
    e counted with the parameters; a ZeRO-3 shard of 12 layers of 1e6 over 8 ranks is 1 byte
    per parameter instead of 2: -1.5e6; gathers move the layers' parameters at 1 byte; nothing
    is cast per microbatch."""
    fp8ag = Plan(zero=1, prec="fp8", fp8ag=1)
    assert fp8_weight_bytes(fp8ag, 12, 1e6, 2) == 0.0
    assert fp8_weight_bytes(fp8ag.replace(zero=3, d=8), 12, 1e6, 2) == pytest.approx(-1.5e6)
    assert gathered_bytes(10e6, 8e6, 2, 1) == 12e6 and gathered_bytes(10e6, 8e6, 2, 0) == 20e6
    assert casts_every_forward(False, Plan(prec="fp8")) and not casts_every_forward(False, fp8ag)
    assert not casts_every_forward(True, Plan(prec="fp8")) and not casts_every_forward(False, Plan())


def test_fp8_parameters_rules_and_prediction():
    """fp8ag needs prec=fp8, ZeRO >= 1 and no offload; on NVIDIA's GPT-3 fp8 recipe (ZeRO-1) it
    saves the bf16 weights (2 bytes per layer parameter) and half the layers' parameter gather."""
    for text, message in [
        ("t=4,p=8,fp8ag=1", "fp8ag=1 (fp8 parameters) needs prec=fp8"),
        ("t=4,p=8,prec=fp8,fp8ag=1,zero=0", "needs zero >= 1"),
        ("t=4,p=8,prec=fp8,fp8ag=2,zero=1", "fp8ag must be 0 or 1, got 2"),
        ("t=4,p=8,prec=fp8,fp8ag=1,zero=1,offload=cpu", "fp8ag=1 with offload=cpu is not modelled"),
    ]:
        with pytest.raises(PlanError, match=re.escape(message)):
            parse_plan(text, GPT, 128, 256)
    h100 = H100
    plan, _ = parse_plan("t=4,p=8,mb=1,zero=1,v=12,sp=1,prec=fp8", GPT, 128, 256)
    assert plan.to_string().endswith(",prec=fp8")
    with_params = plan.replace(fp8ag=1)
    assert with_params.to_string().endswith(",prec=fp8,fp8ag=1") and with_params.to_dict()["fp8ag"] == 1
    a, b = (estimate(Job(GPT, h100, q, 256)) for q in (plan, with_params))
    layer = layer_params_per_rank(GPT, 4)
    layers = GPT.num_layers // 8
    assert a.peak_memory - b.peak_memory == pytest.approx(2 * layers * layer, rel=1e-9)
    assert b.step_time < a.step_time


def test_plan_key_round_trip_and_bad_input():
    plan, _ = parse_plan("t=4,p=8,v=12,sp=1,prec=fp8", GPT, 128, 256)
    assert plan.prec == "fp8" and plan.to_string().endswith(",prec=fp8") and plan.to_dict()["prec"] == "fp8"
    assert "prec" not in Plan().to_string()
    with pytest.raises(PlanError, match="key 'prec': expected one of bf16, fp8"):
        parse_plan("t=4,prec=fp4", GPT, 128, 256)
    a100 = load_cluster("dgx-a100-80gb", 16)
    with pytest.raises(PlanError, match="prec=fp8 needs fp8 tensor cores: the GPU profile a100-sxm4-80gb"):
        Job(GPT, a100, plan, 256)
    with pytest.raises(PlanError, match="--fix: prec=fp8 needs fp8 tensor cores"):
        space.precisions(a100.gpu, {"prec": "fp8"})
    odd = GPT.model_copy(update={"hidden_size": 12296})  # 12296 / 16 is not whole
    assert any("divisible by 16" in e for e in plan_errors(odd, Plan(t=1, d=128, prec="fp8"), 128, 256))
    assert "prec=fp8" in (unsupported_reason(GPT, plan, 8) or "")


def test_search_tries_fp8_only_where_the_gpu_runs_it():
    assert space.precisions(H100.gpu, {}) == ("bf16", "fp8")
    assert space.precisions(load_cluster("dgx-a100-80gb").gpu, {}) == ("bf16",)
    assert space.precisions(H100.gpu, {"prec": "bf16"}) == ("bf16",)
    both = space.enumerate_plans(GPT, 128, 256, {"t": 8, "p": 8}, 8, ("bf16", "fp8"))
    assert len(both) == 2 * len(space.enumerate_plans(GPT, 128, 256, {"t": 8, "p": 8}, 8))
    found = search(GPT, H100, 256, SearchOptions(fix="t=4,p=8", fidelity="analytic", top=3, partition=False))
    assert found.best_result.job.plan.prec == "fp8"  # fp8 linears are faster on an H100


def test_search_gives_fp8_plans_fp8_parameters_where_they_can_have_them():
    plans = space.enumerate_plans(GPT, 128, 256, {"t": 8, "p": 8}, 8, ("bf16", "fp8"))
    assert all(q.fp8ag == (q.prec == "fp8" and q.zero >= 1 and q.offload == "none") for q in plans)
    pinned = space.enumerate_plans(GPT, 128, 256, {"t": 8, "p": 8, "fp8ag": 0}, 8, ("bf16", "fp8"))
    assert len(pinned) == len(plans) and not any(q.fp8ag for q in pinned)
    only = space.enumerate_plans(GPT, 128, 256, {"t": 8, "p": 8, "fp8ag": 1}, 8, ("bf16", "fp8"))
    assert only and all(q.fp8ag and q.prec == "fp8" for q in only)
    with pytest.raises(PlanError, match="fp8ag must be 0 or 1, got 3"):
        search(GPT, H100, 256, SearchOptions(fix="t=8,p=8,fp8ag=3", fidelity="analytic", partition=False))


def test_analytic_and_des_agree_on_an_fp8_plan():
    """The fp8 terms are the same rules in both: time within 3%, memory within 0.5%, and fp8 against
    bf16 changes memory by the same bytes in both."""
    ab, db = analytic_and_des(GPT, H100, "t=4,p=8,v=12,mb=1,zero=1,sp=1", 256, 0.03, 0.005)
    af, df = analytic_and_des(GPT, H100, "t=4,p=8,v=12,mb=1,zero=1,sp=1,prec=fp8", 256, 0.03, 0.005)
    assert af.step_time < 0.8 * ab.step_time  # NVIDIA's recipe: 8.91 s bf16, 5.92 s fp8
    assert df.peak_memory - db.peak_memory == pytest.approx(af.peak_memory - ab.peak_memory, rel=0.01)


@pytest.mark.parametrize(
    "case",
    [
        ("gpt3-175b", 16, 256, "t=4,p=8,v=12,mb=1,zero=1,sp=1,prec=fp8", 0.005),
        ("llama3-8b", 2, 128, "t=2,p=1,mb=4,zero=3,ckpt=full,prec=fp8", 0.02),
    ],
    ids=lambda c: c[3],
)
def test_analytic_and_des_agree_on_fp8_parameters(case):
    """fp8ag=1 in both models: the same time and memory agreement as the fp8 plan, and the same
    change against fp8ag=0 (ZeRO-1: the bf16 weights gone; ZeRO-3: 1-byte shards and gathers)."""
    name, nodes, batch, text, memory_rel = case
    model, cluster = load_model(name), load_cluster("dgx-h100", nodes)
    a0, d0 = analytic_and_des(model, cluster, text, batch, 0.03, memory_rel)
    a1, d1 = analytic_and_des(model, cluster, text + ",fp8ag=1", batch, 0.03, memory_rel)
    assert a1.peak_memory < a0.peak_memory and a1.step_time <= a0.step_time
    assert d0.peak_memory - d1.peak_memory == pytest.approx(a0.peak_memory - a1.peak_memory, rel=0.02)


def test_weights_cast_every_microbatch_where_the_program_does_not_cache_them():
    """Transformer Engine caches the fp8 weights only when told the first microbatch
    (Megatron-core); llm-foundry's TE layers and torchao float8 cast them in every forward:
    e + 2 bytes per linear weight (fp8 copy and transpose), once per forward and full recompute.
    Llama-3-8B at t=2: (h(h + 2kv) + h^2 + 3hf)/2 = 109,051,904 weights per rank and layer."""
    llama = load_model("llama3-8b")
    op = weight_cast_op(llama, 2, 2)
    assert op.flops == (4096 * (4096 + 2048) + 4096**2 + 3 * 4096 * 14336) / 2 == 109_051_904
    assert op.bytes == 4 * 109_051_904 and op.kernels == 4
    plan, _ = parse_plan("t=2,p=2,mb=1,zero=1,ckpt=full,prec=fp8", llama, 16, 64)
    cluster = load_cluster("dgx-h100", 2)
    cached = Job(llama, cluster, plan, 64)
    recast = dataclasses.replace(cached, runtime=dataclasses.replace(OVERLAPPED, fp8_weight_cache=False))
    stage = stage_costs(llama, cluster, plan)[0]  # 16 layers, all fully recomputed: 32 casts per microbatch
    assert stage.weight_cast == pytest.approx(32 * block_times(llama, cluster, 2, False, 1, "fp8").fp8_weight_cast)
    a0, a1 = estimate(cached), estimate(recast)
    # 1F1B: every microbatch, and the bubble's p - 1 on the critical stage
    assert a1.step_time - a0.step_time == pytest.approx((cached.m + plan.p - 1) * stage.weight_cast, rel=0.01)
    d1 = simulate_des(recast)
    assert d1.step_time == pytest.approx(a1.step_time, rel=0.02)
    batch = estimate_batch(llama, cluster, [plan], 64, recast.runtime)
    assert batch.step_time[0] == pytest.approx(a1.step_time, rel=1e-9)
    bf16 = plan.replace(prec="bf16")
    assert (
        estimate(dataclasses.replace(recast, plan=bf16)).step_time == estimate(Job(llama, cluster, bf16, 64)).step_time
    )
