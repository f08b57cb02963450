"""simulator.cost.params and the iteration FLOPs of simulator.cost.workload against papers and model cards."""

from __future__ import annotations

import pytest

from simulator.cost import params, workload
from simulator.model_files import load_model
from simulator.specs import ModelSpec

V_MEGATRON, S_MEGATRON = 51200, 2048

# Narayanan et al. 2021 (SC'21), Table 1: (params in billions as printed, heads, hidden, layers).
# The rows of published.yaml are checked from there; the other five are the table's remaining rows.
MEGATRON_TABLE1_EXTRA = [
    (3.6, 32, 3072, 30),
    (18.4, 48, 6144, 40),
    (76.1, 80, 10240, 60),
    (310.1, 128, 16384, 96),
    (529.6, 128, 20480, 105),
]


def megatron_rows(published) -> list[tuple[float, int, int, int]]:
    rows = [(r["params_B"], r["heads"], r["hidden"], r["layers"]) for r in published["megatron_2021_throughput"]]
    return sorted(rows + MEGATRON_TABLE1_EXTRA)


def gpt(l: int, h: int, a: int, V: int = V_MEGATRON, s: int = S_MEGATRON) -> ModelSpec:
    return ModelSpec(num_layers=l, hidden_size=h, num_attention_heads=a, vocab_size=V, seq_length=s)


def test_megatron_table1_parameter_counts(published):
    rows = megatron_rows(published)
    assert [r[0] for r in rows] == [1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0]
    for p_b, a, h, l in rows:
        m = gpt(l, h, a)
        for count in (params.total_params(m), params.megatron_params_formula(m)):
            # The table prints one decimal: the count must round to the printed figure ...
            assert round(count / 1e9, 1) == p_b, (p_b, count)
            # ... and be within 1% of it; the two smallest rows are only given to +-0.05B
            # (1.652B prints as 1.7, 3.562B as 3.6), which is more than 1% of them.
            assert abs(count / 1e9 - p_b) <= max(0.01 * p_b, 0.05), (p_b, count)


def test_total_params_vs_megatron_formula():
    """P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) counts per layer 12h^2 + 13h, the
    embeddings (V+s)h; the op-by-op count adds the final LayerNorm (2h)."""
    for l, h, a in [(24, 2304, 24), (96, 12288, 96), (128, 25600, 160)]:
        m = gpt(l, h, a)
        assert params.layer_params(m) == 12 * h * h + 13 * h
        assert params.total_params(m) == l * (12 * h * h + 13 * h) + (V_MEGATRON + S_MEGATRON) * h + 2 * h
        assert params.total_params(m) - params.megatron_params_formula(m) == pytest.approx(2 * h, abs=1e-3 * h)


@pytest.mark.parametrize(
    "name,count",
    [
        # exact counts of the released checkpoints (Hugging Face model cards / safetensors metadata)
        ("llama2-7b", 6_738_415_616),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
    ],
)
def test_builtin_llama_parameter_counts_are_exact(name, count):
    assert params.total_params(load_model(name)) == count


def test_builtin_gpt_models():
    m = load_model("gpt3-175b")
    assert abs(params.total_params(m) / 175e9 - 1) < 0.01
    m = load_model("gpt-1t")
    assert round(params.total_params(m) / 1e9, 1) == 1008.0


def test_llama_layer_by_hand():
    """Llama-2-70B layer: q,k,v,o = 8192*(8192 + 2*1024) + 8192^2 = 150,994,944;
    SwiGLU MLP 3*8192*28672 = 704,643,072; two RMSNorm weights 16,384; no biases."""
    m = load_model("llama2-70b")
    assert params.layer_params(m) == 150_994_944 + 704_643_072 + 16_384
    assert params.embedding_params(m) == 32000 * 8192  # rotary: no position table
    assert params.head_params(m) == 8192 + 32000 * 8192  # untied output layer + final norm


# ------------------------------------------------------------------ per rank under TP


def test_gpt_layer_params_per_rank_by_hand():
    """h=1024, ffn=4h, t=4. Split by t: weights 12h^2 = 12,582,912 and the column-parallel
    biases (QKV 3h, fc1 4h) = 7,168; replicated: proj and fc2 biases and two LayerNorms, 6h = 6,144.
    Per rank: (12,582,912 + 7,168)/4 + 6,144 = 3,153,664."""
    m = gpt(24, 1024, 16, V=50304, s=1024)
    assert params.layer_params_per_rank(m, 4) == 3_153_664
    assert params.layer_params_per_rank(m, 1) == params.layer_params(m) == 12_596_224
    # vocab-parallel embedding V*h/t, position table replicated: 50304*1024/4 + 1024*1024
    assert params.embedding_params_per_rank(m, 4) == 12_877_824 + 1_048_576
    # tied embeddings: the head holds only the final LayerNorm with p = 1, its own copy of
    # the word embedding on the last stage with p > 1
    assert params.head_params_per_rank(m, 4, 1) == 2048
    assert params.head_params_per_rank(m, 4, 2) == 2048 + 12_877_824


def test_llama_params_per_rank_by_hand():
    m = load_model("llama2-70b")
    # no biases: (150,994,944 + 704,643,072)/8 + 16,384 (RMSNorm weights replicated)
    assert params.layer_params_per_rank(m, 8) == 106_954_752 + 16_384
    assert params.embedding_params_per_rank(m, 8) == 32000 * 8192 / 8
    assert params.head_params_per_rank(m, 8, 1) == 8192 + 32000 * 8192 / 8


@pytest.mark.parametrize("name", ["tiny", "gpt3-175b", "llama2-7b", "llama3-8b"])
def test_stage_params_cover_the_model(name):
    m = load_model(name)
    l = m.num_layers
    # one rank holding everything is the whole model
    assert params.stage_params_per_rank(m, 1, 1, l, True, True) == params.total_params(m)
    # a pipeline split: the stages add up to the model (+ a second word embedding if tied)
    half = l // 2
    two = params.stage_params_per_rank(m, 1, 2, half, True, False) + params.stage_params_per_rank(
        m, 1, 2, l - half, False, True
    )
    extra = m.vocab_size * m.hidden_size if m.tie_embeddings else 0
    assert two == params.total_params(m) + extra


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tp_ranks_add_up_to_the_layer(t):
    """Across the t ranks the split part is counted once and the replicated part t times."""
    for m in (load_model("gpt3-175b"), load_model("llama2-70b")):
        h = m.hidden_size
        replicated = 6 * h if m.normalization == "LayerNorm" else 2 * h
        assert t * params.layer_params_per_rank(m, t) == pytest.approx(params.layer_params(m) + (t - 1) * replicated)


# ---------------------------------------------------------------------------- FLOPs


def test_megatron_eq3_by_hand_gpt3():
    """F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) for GPT-3 175B, B = 1536, expanded:
    96 B s l h^2 + 16 B s^2 l h + 6 B s h V."""
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    expected = 96 * B * s * l * h**2 + 16 * B * s**2 * l * h + 6 * B * s * h * V
    m = load_model("gpt3-175b")
    assert workload.megatron_flops_with_recompute(m, B) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(4.511e18, rel=1e-3)  # 4.5 EFLOP per iteration


@pytest.mark.parametrize("name,B", [("gpt3-175b", 1536), ("gpt-1t", 3072), ("tiny", 8)])
def test_executed_flops_with_full_recompute_is_megatron_eq3(name, B):
    m = load_model(name)
    got = workload.executed_flops_per_iteration(m, B, full_layers=m.num_layers, selective_layers=0)
    assert got == pytest.approx(workload.megatron_flops_with_recompute(m, B), rel=1e-12)


def test_model_flops_are_three_forwards():
    """Model FLOPs (no recompute): 3 * (l * (24 B s h^2 + 4 B s^2 h) + 2 B s h V)."""
    m = load_model("gpt3-175b")
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    expected = 3 * (l * (24 * B * s * h**2 + 4 * B * s**2 * h) + 2 * B * s * h * V)
    assert workload.model_flops_per_iteration(m, B) == pytest.approx(expected, rel=1e-12)
    assert workload.executed_flops_per_iteration(m, B, 0, 0) == pytest.approx(expected, rel=1e-12)
    # selective recompute redoes only the attention core, 4 B s^2 h per layer
    sel = workload.executed_flops_per_iteration(m, B, 0, l)
    assert sel - expected == pytest.approx(l * 4 * B * s**2 * h, rel=1e-9)


def test_parameter_flops_rule_of_thumb():
    """6 * params * tokens is the usual estimate of training FLOPs without recomputation;
    for a model with s << 6h it is within a few percent of the exact count."""
    m = load_model("gpt-1t")
    B = 3072
    approx = 6 * params.total_params(m) * B * m.seq_length
    assert workload.model_flops_per_iteration(m, B) == pytest.approx(approx, rel=0.03)
