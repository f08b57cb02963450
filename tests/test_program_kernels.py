"""How autoplan's program runs a layer and a GEMM table: the autocast traffic and the activations the
eager program adds (simulator.cost.eager_layer), the measured GEMM grid used as a table and the
measured attention points (simulator.cost.ops), each against numbers derived by hand."""

from __future__ import annotations

import pytest

from hwprofiles.schema import GpuProfile
from simulator.cost import ops
from simulator.cost.eager_layer import eager_activation_bytes, eager_layer_ops
from simulator.cost.ops import backward_ops
from simulator.cost.params import layer_params_per_rank
from simulator.cost.stage_memory import layer_activations
from simulator.specs import ModelSpec

GPT13 = ModelSpec(
    name="gpt-1.3b",
    num_layers=24,
    hidden_size=2048,
    num_attention_heads=16,
    ffn_hidden_size=8192,
    vocab_size=50304,
    seq_length=2048,
)


def test_autocast_traffic_of_a_gpt_layer_by_hand():
    # mb=4 x 2048 tokens x hidden 2048 = 16,777,216 residual-stream elements
    n = 4 * 2048 * 2048
    params = layer_params_per_rank(GPT13, 1)
    stream, casts, weights = eager_layer_ops(GPT13, 4, 1, False, params)
    # forward: 2 fp32 norms (+4 B each) and 2 fp32 residual adds (+3 B each) = 14 B per element
    assert stream.bytes == pytest.approx(14 * n)
    # q, k, v and fc1 each cast the norm's output: 4 x 6 B; backward: 4 casts back (6 B) and the
    # q, k, v gradients summed into one (2 sums x 12 B)
    assert casts.bytes == pytest.approx(24 * n)
    assert backward_ops(casts)[0].bytes == pytest.approx((24 + 24) * n)
    # each weight cast once per forward (6 B), its gradient cast back and accumulated in fp32 (+12 B)
    assert weights.bytes == pytest.approx(6 * params)
    assert backward_ops(weights)[0].bytes == pytest.approx(12 * params)
    total_forward = stream.bytes + casts.bytes + weights.bytes
    assert total_forward == pytest.approx(0.94e9, rel=0.01)  # the module docstring's figure


def test_llama_layers_cast_the_mlp_input_twice():
    llama = GPT13.model_copy(update={"activation": "swiglu", "normalization": "RMSNorm"})
    _, casts, _ = eager_layer_ops(llama, 1, 1, False, 1.0)
    n = 2048 * 2048
    assert casts.bytes == pytest.approx(5 * 6 * n)  # q, k, v, gate, up
    assert backward_ops(casts)[0].bytes == pytest.approx((5 * 6 + 3 * 12) * n)  # 2 + 1 sums


def _gpu(table: list[dict], attention: dict | None = None) -> GpuProfile:
    return GpuProfile(
        name="g",
        peak_tflops={"bf16": 100.0},
        memory_GiB=80,
        memory_bandwidth_GBps=1000,
        memory_efficiency=0.8,
        default_dtype="bf16",
        gemm={"max_efficiency": 0.8, "half_dim_m": 64, "half_dim_n": 64, "half_dim_k": 64, "table": table},
        attention=attention,
    )


def _grid(rate) -> list[dict]:
    return [
        {"m": m, "n": n, "k": k, "tflops": rate(m, n, k), "dtype": "bf16"}
        for m in (256, 1024)
        for n in (256, 1024)
        for k in (256, 1024)
    ]


def test_eager_layers_keep_fp32_norm_inputs_and_a_cast_per_linear_by_hand():
    # gpt-1.3b at mb=4: 16,777,216 residual-stream elements per layer
    n = 4 * 2048 * 2048
    # two fp32 norm inputs (+2 B each), q/k/v's two more bf16 copies (+2 B each), no dropout masks (-2 B)
    assert eager_activation_bytes(GPT13, 4, 1, False, "none") == 6 * n
    assert eager_activation_bytes(GPT13, 4, 1, False, "selective") == 6 * n
    # a fully recomputed layer keeps its fp32 input where the formula counts 2 bytes
    assert eager_activation_bytes(GPT13, 4, 1, False, "full") == 2 * n
    # measured on an H100 and an H200 (benchmarks/data/h200-2026-11-27/runs2.jsonl): mb=1, 2 and 4 of
    # gpt-1.3b peaked 0.65, 1.22 and 2.39 GiB above the fused layer's figure, 24 layers x 6 B a sample:
    assert 24 * eager_activation_bytes(GPT13, 1, 1, False, "none") / 2**30 == pytest.approx(0.5625)
    none = layer_activations(GPT13, 4, 1, False, 2)[2]
    assert layer_activations(GPT13, 4, 1, False, 2, kernels="eager")[2] == none + 6 * n


def test_eager_swiglu_keeps_the_silu_output_and_casts_its_input_twice():
    llama = ModelSpec(
        name="llama7b-slice", num_layers=6, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=11008,
        vocab_size=32000, seq_length=4096, activation="swiglu", normalization="RMSNorm",
        position_embedding_type="rope", tie_embeddings=False,
    )  # fmt: skip
    n = 4096 * 4096
    # +4 (norms) +4 (q, k, v) +2 (gate and up cast apart) -2 (no dropout) = 8 B per element, and the
    # SiLU output, 2 B per element of the 11,008-wide MLP
    assert eager_activation_bytes(llama, 1, 1, False, "none") == 8 * n + 2 * 4096 * 11008
    # with t = 2 and no sequence parallelism the stream terms stay whole, the MLP's halve
    assert eager_activation_bytes(llama, 1, 2, False, "none") == 8 * n + 4096 * 11008


def test_a_full_grid_is_interpolated_in_log_space_between_its_shapes():
    g = _gpu(_grid(lambda m, n, k: 20.0 if m == 256 else 80.0))
    assert ops.gemm_efficiency(g, 256, 512, 512) == pytest.approx(0.2)  # on a measured value of m
    # halfway in log2(m) between 20 and 80 TFLOP/s: the geometric mean, 40
    assert ops.gemm_efficiency(g, 512, 512, 512) == pytest.approx(0.4)
    # beyond the grid: the edge's efficiency carried by the curve, (4096/4160) / (1024/1088)
    beyond = ops.gemm_efficiency(g, 4096, 1024, 1024)
    assert beyond == pytest.approx(0.8 * (4096 / 4160) / (1024 / 1088))


def test_a_scattered_table_still_interpolates():
    g = _gpu(_grid(lambda m, n, k: 50.0)[:-1])  # one corner missing: not a grid
    assert ops.gemm_grid(g, "bf16") is None
    assert ops.gemm_efficiency(g, 256, 256, 256) == pytest.approx(0.5)


def test_measured_attention_points_are_interpolated_over_sequence_length():
    points = [
        {"seq": 1024, "head_dim": 128, "forward_tflops": 40.0, "backward_tflops": 20.0},
        {"seq": 4096, "head_dim": 128, "forward_tflops": 80.0, "backward_tflops": 60.0},
        {"seq": 1024, "head_dim": 64, "forward_tflops": 10.0, "backward_tflops": 5.0},
    ]
    g = _gpu(
        _grid(lambda m, n, k: 50.0),
        {"forward_efficiency": 0.9, "backward_efficiency": 0.9, "half_seq": 1024, "table": points},
    )
    # s = 2048 is halfway in log2 between 1024 and 4096: geometric mean of 40 and 80 over 100
    assert ops.attention_table_efficiency(g, 2048, 128, False) == pytest.approx((40 * 80) ** 0.5 / 100)
    assert ops.attention_table_efficiency(g, 4096, 128, True) == pytest.approx(0.6)
    assert ops.attention_table_efficiency(g, 1024, 80, False) == pytest.approx(0.1)  # nearest head dim: 64
    # past the longest measured sequence: the curve's s / (s + 1024) carries 80 TFLOP/s on
    longer = ops.attention_table_efficiency(g, 8192, 128, False)
    assert longer == pytest.approx(0.8 * (8192 / 9216) / (4096 / 5120))
