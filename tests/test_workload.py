"""simulator.cost.workload (ops, FLOPs) and simulator.cost.ops (roofline op time), by hand."""

from __future__ import annotations

import pytest

from hwprofiles.schema import GpuProfile
from simulator.cost import op as op_
from simulator.cost import ops, workload
from simulator.model_files import load_model
from simulator.specs import ModelSpec


def materialized(m: ModelSpec) -> ModelSpec:
    """The model with Megatron-LM 2021's materialized attention, which these hand derivations count op by op."""
    return m.model_copy(update={"attention": "materialized"})


GEMM_KINDS = ("gemm", "bmm")


def gemm_flops(op_list) -> float:
    return sum(o.flops for o in op_list if o.kind in GEMM_KINDS)


def test_layer_forward_flops_megatron():
    """24 b s h^2 + 4 b s^2 h per layer (dense MHA, ffn = 4h, GELU)."""
    m = materialized(load_model("gpt3-175b"))
    b, s, h = 2, 2048, 12288
    expected = 24 * b * s * h**2 + 4 * b * s**2 * h
    assert workload.layer_forward_flops(m, b) == expected
    assert gemm_flops(workload.layer_forward_ops(m, b, 1, False, 2)) == expected


def test_layer_forward_flops_gqa_swiglu():
    """Llama-2-70B (h=8192, 8 KV heads of 128, ffn 28672, SwiGLU), b=1, s=4096:
    QKV 2bsh(h+2kv) + attention 4bs^2h + proj 2bsh^2 + MLP 3 * 2bshf."""
    m = materialized(load_model("llama2-70b"))
    b, s, h, kv, f = 1, 4096, 8192, 1024, 28672
    expected = 2 * b * s * h * (h + 2 * kv) + 4 * b * s**2 * h + 2 * b * s * h**2 + 6 * b * s * h * f
    assert workload.layer_forward_flops(m, b) == expected
    assert gemm_flops(workload.layer_forward_ops(m, b, 1, False, 2)) == expected


@pytest.mark.parametrize("name,t", [("gpt3-175b", 8), ("llama2-70b", 8), ("llama3-8b", 4), ("tiny", 2)])
@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_divides_gemms(name, t, sp):
    m = materialized(load_model(name))
    per_rank = workload.layer_forward_ops(m, 1, t, sp, 2)
    assert gemm_flops(per_rank) * t == pytest.approx(workload.layer_forward_flops(m, 1), rel=1e-12)


def test_layer_gemm_shapes_megatron_split():
    """GPT-3 layer on one of t=8 ranks, b=1: QKV column-parallel [s, 3h/t, h], attention per
    head (96/8 = 12 heads), projection row-parallel [s, h, h/t], fc1 [s, 4h/t, h], fc2 [s, h, 4h/t]."""
    m = materialized(load_model("gpt3-175b"))
    by_name = {o.name: o for o in workload.layer_forward_ops(m, 1, 8, False, 2)}
    s, h = 2048, 12288
    assert (by_name["qkv"].m, by_name["qkv"].n, by_name["qkv"].k) == (s, 3 * h // 8, h)
    assert (by_name["proj"].m, by_name["proj"].n, by_name["proj"].k) == (s, h, h // 8)
    assert (by_name["fc1"].m, by_name["fc1"].n, by_name["fc1"].k) == (s, 4 * h // 8, h)
    assert (by_name["fc2"].m, by_name["fc2"].n, by_name["fc2"].k) == (s, h, 4 * h // 8)
    assert by_name["scores"].count == 12 and (by_name["scores"].m, by_name["scores"].n, by_name["scores"].k) == (
        s,
        s,
        128,
    )
    assert by_name["attn_v"].count == 12


def test_sequence_parallel_splits_elementwise_work():
    m = materialized(load_model("gpt3-175b"))
    plain = {o.name: o for o in workload.layer_forward_ops(m, 1, 8, False, 2)}
    sp = {o.name: o for o in workload.layer_forward_ops(m, 1, 8, True, 2)}
    for name in ("ln1", "ln2", "dropout_residual1", "dropout_residual2"):
        assert sp[name].bytes * 8 == pytest.approx(plain[name].bytes)
    assert sp["softmax"].bytes == plain["softmax"].bytes


def test_logits_flops():
    m = materialized(load_model("gpt3-175b"))
    assert workload.logits_forward_flops(m, 3) == 2 * 3 * 2048 * 12288 * 51200
    head = {o.name: o for o in workload.head_forward_ops(m, 3, 8, False, 2)}
    assert head["logits"].flops * 8 == workload.logits_forward_flops(m, 3)
    # a vocabulary not divisible by t: each rank gets ceil(V/t) columns
    odd = ModelSpec(
        num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1001, seq_length=16, attention="materialized"
    )
    assert {o.name: o for o in workload.head_forward_ops(odd, 1, 4, False, 2)}["logits"].n == 251


def test_a_gathered_loss_runs_over_the_whole_vocabulary():
    """DeepSpeed's AutoTP all-gathers the logits before the loss: each of the t = 4 ranks computes
    its 16 x 251 logits, then the cross-entropy over all 16 x 1001 (36 + e = 38 bytes each)."""
    odd = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1001, seq_length=16)
    split = {o.name: o for o in workload.head_forward_ops(odd, 1, 4, False, 2)}
    gathered = {o.name: o for o in workload.head_forward_ops(odd, 1, 4, False, 2, gathered=True)}
    assert gathered["logits"] == split["logits"]
    assert split["cross_entropy"].bytes == 16 * 251 * 38
    assert gathered["cross_entropy"].bytes == 16 * 1001 * 38


def test_gemm_op_bytes():
    op = op_.gemm("x", 3, 5, 7, 2)
    assert op.flops == 2 * 3 * 5 * 7 and op.bytes == 2 * (3 * 7 + 7 * 5 + 3 * 5)
    batched = op_.gemm("y", 3, 5, 7, 2, count=4)
    assert batched.kind == "bmm" and batched.flops == 4 * op.flops and batched.bytes == 4 * op.bytes


# -------------------------------------------------------------------------- roofline


def gpu(**kw) -> GpuProfile:
    base = dict(
        name="test-gpu",
        peak_tflops={"fp16": 100.0, "fp32": 10.0},
        memory_GiB=10,
        memory_bandwidth_GBps=1000,
        memory_efficiency=0.5,
        kernel_launch_us=5.0,
        gemm={"max_efficiency": 0.8, "half_dim_m": 64, "half_dim_n": 64, "half_dim_k": 32},
    )
    base.update(kw)
    return GpuProfile.model_validate(base)


def test_curve_efficiency_by_hand():
    g = gpu()
    # 0.8 * 1024/1088 * 1024/1088 * 1024/1056
    assert ops.gemm_efficiency(g, 1024, 1024, 1024) == pytest.approx(0.8 * (1024 / 1088) ** 2 * (1024 / 1056))
    # a dimension equal to its half_dim halves throughput
    assert ops.curve_efficiency(g, 64, 1e12, 1e12) == pytest.approx(0.4, rel=1e-6)
    # small / skinny GEMMs run far below big ones
    assert ops.gemm_efficiency(g, 8192, 96, 8192) < 0.7 * ops.gemm_efficiency(g, 8192, 8192, 8192)


def test_op_time_compute_bound_gemm():
    g = gpu()
    op = op_.gemm("big", 1024, 1024, 1024, 2)
    eff = 0.8 * (1024 / 1088) ** 2 * (1024 / 1056)
    compute = 2 * 1024**3 / (100e12 * eff)  # 31.2 us, over the 12.6 us of memory traffic
    assert ops.op_time(op, g) == pytest.approx(compute + 5e-6, rel=1e-9)


def test_op_time_memory_bound_elementwise():
    g = gpu()
    op = op_.elementwise("add", 1e6, 4, 1)
    # 4e6 bytes at 1000 GB/s * 0.5 = 8 us; 1e6 FLOPs at 10 TFLOP/s = 0.1 us; + 5 us launch
    assert ops.op_time(op, g) == pytest.approx(8e-6 + 5e-6, rel=1e-9)


def test_measured_table_is_exact_at_a_measured_shape():
    g = gpu(
        gemm={
            "max_efficiency": 0.8,
            "table": [
                {"m": 1024, "n": 1024, "k": 1024, "tflops": 50.0},
                {"m": 4096, "n": 4096, "k": 4096, "tflops": 75.0},
            ],
        }
    )
    assert ops.gemm_efficiency(g, 1024, 1024, 1024) == pytest.approx(0.5)
    assert ops.gemm_efficiency(g, 4096, 4096, 4096) == pytest.approx(0.75)
    between = ops.gemm_efficiency(g, 2048, 2048, 2048)
    assert 0.5 < between < 0.8


def test_backward_is_two_gemms_of_forward_size():
    op = op_.gemm("fc1", 2048, 512, 1024, 2)
    dgrad, wgrad = ops.backward_ops(op)
    assert (dgrad.m, dgrad.n, dgrad.k) == (2048, 1024, 512)  # dA = dC B^T
    assert (wgrad.m, wgrad.n, wgrad.k) == (1024, 512, 2048)  # dB = A^T dC
    assert dgrad.flops + wgrad.flops == 2 * op.flops
    (ew,) = ops.backward_ops(op_.elementwise("gelu", 100, 4, 8))
    assert ew.flops == 1600 and ew.bytes == 800


def test_layer_backward_flops_twice_forward():
    m = materialized(load_model("gpt3-175b"))
    fwd = workload.layer_forward_ops(m, 1, 8, False, 2)
    bwd = [b for o in fwd for b in ops.backward_ops(o)]
    assert gemm_flops(bwd) == pytest.approx(2 * gemm_flops(fwd))
