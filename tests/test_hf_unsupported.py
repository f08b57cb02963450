"""A Hugging Face config.json whose architecture autoplan does not model is refused by the key
that says so (simulator.hf_unsupported), never planned as a different, dense model."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from hwprofiles import InputError
from simulator.cost import params
from simulator.model_files import load_model

MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json
    "architectures": ["MixtralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1e6,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
DENSE = {k: v for k, v in MIXTRAL_8X7B.items() if k not in ("num_local_experts", "num_experts_per_tok")}


def write(tmp_path, cfg, name="config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def test_mixtral_plans_as_a_mixture_of_experts_on_the_command_line(tmp_path):
    """Routed experts in every layer are modelled (simulator.cost.experts): Mixtral's config loads
    as 46.7 B parameters, not as the dense Mistral-7B of its other keys."""
    assert params.total_params(load_model(write(tmp_path, MIXTRAL_8X7B))) == 46_702_792_704
    r = run_cli(
        "plan",
        "--model",
        write(tmp_path, MIXTRAL_8X7B),
        "--cluster",
        "dgx-a100-80gb",
        "--nodes",
        "4",
        "--global-batch",
        "64",
        "--seq-len",
        "2048",
        "--fidelity",
        "analytic",
    )
    assert r.returncode == 0, r.stderr
    assert "plan string:" in r.stdout


def test_the_dense_remainder_still_loads(tmp_path):
    """Without the expert keys the same config is Mistral-7B's shape (7.24 B parameters)."""
    assert params.total_params(load_model(write(tmp_path, DENSE))) == 7_241_732_096


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (
            {"num_experts": 60, "shared_expert_intermediate_size": 5632},
            "shared_expert_intermediate_size",
        ),  # Qwen1.5-MoE
        ({"n_routed_experts": 64, "n_shared_experts": 2}, "n_routed_experts"),  # DeepSeek-MoE
        ({"q_lora_rank": 1536, "kv_lora_rank": 512}, "q_lora_rank"),  # DeepSeek-V2 MLA
        ({"parallel_attn": True}, "parallel_attn"),  # Falcon
        ({"use_parallel_residual": True}, "use_parallel_residual"),  # GPT-NeoX
        ({"alibi": True}, "alibi"),  # Falcon-RW
        ({"multi_query": True}, "multi_query"),  # Falcon-7B
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),  # Gemma 3
        ({"num_nextn_predict_layers": 1}, "num_nextn_predict_layers"),  # DeepSeek-V3 MTP
        ({"is_encoder_decoder": True}, "is_encoder_decoder"),  # T5-style
        ({"head_dim": 256}, "head_dim"),  # Gemma: 32 heads of 256 != 4096
    ],
)
def test_each_architecture_key_is_named(tmp_path, extra, key):
    with pytest.raises(InputError, match=rf"key '{key}'"):
        load_model(write(tmp_path, dict(DENSE, **extra)))


@pytest.mark.parametrize(
    "extra",
    [
        {"num_local_experts": 0},  # "no experts" spelled out
        {"parallel_attn": False, "use_parallel_residual": False, "alibi": False},
        {"head_dim": 128},  # = hidden/heads (Qwen3 style)
        {"sliding_window": 131072, "use_sliding_window": False},  # Qwen2: configured but off
        {"sliding_window": 32768},  # a window as long as the sequence attends to everything
        {"layer_types": ["full_attention"] * 32},
    ],
)
def test_dense_spellings_are_accepted(tmp_path, extra):
    assert params.total_params(load_model(write(tmp_path, dict(DENSE, **extra)))) == 7_241_732_096


def test_sliding_window_shorter_than_the_sequence(tmp_path):
    """Mistral-7B-v0.1 (4096-token window, 32768 positions): refused at its full length, planned
    exactly with a --seq-len inside the window."""
    path = write(tmp_path, dict(DENSE, sliding_window=4096))
    with pytest.raises(InputError, match=r"key 'sliding_window'.*4096.*32768"):
        load_model(path)
    assert load_model(path, seq_len=4096).seq_length == 4096


def test_a_window_beside_a_sequence_length_of_the_wrong_type_is_an_input_error(tmp_path):
    """max_position_embeddings "64" (a string) beside a sliding window was a TypeError (exit 1)."""
    path = write(tmp_path, dict(DENSE, sliding_window=16, max_position_embeddings="64"))
    with pytest.raises(
        InputError, match="key 'sliding_window': sliding-window attention over 16 tokens, shorter than the sequence"
    ):
        load_model(path)
