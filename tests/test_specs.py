"""simulator.specs: models (YAML, built-in, Hugging Face config.json) and plan strings."""

from __future__ import annotations

import json

import pytest
import yaml

from hwprofiles import InputError
from simulator.cost import params
from simulator.job import Job
from simulator.model_files import builtin_models, load_model, model_from_hf_config
from simulator.plan import Plan, parse_plan, parse_plan_items, plan_errors, resolve_plan, validate_plan
from simulator.specs import ModelSpec

GPT3 = load_model("gpt3-175b")


# --------------------------------------------------------------------------- models


def test_builtin_models_of_the_design():
    assert {"gpt3-175b", "gpt-1t", "llama2-7b", "llama2-70b", "llama3-8b", "tiny"} <= set(builtin_models())
    t = load_model("gpt-1t")
    assert (t.num_layers, t.hidden_size, t.num_attention_heads) == (128, 25600, 160)
    tiny = load_model("tiny")
    assert tiny.num_layers <= 8 and 64 <= tiny.hidden_size <= 128
    assert load_model("llama3-8b").rope_theta == 500_000.0  # Llama 3's rotary base
    assert load_model("llama2-7b").rope_theta == 10_000.0


def test_model_defaults():
    m = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=100, seq_length=16)
    assert (m.kv_heads, m.ffn, m.head_dim, m.kv_size) == (4, 256, 16, 64)
    assert m.tie_embeddings and m.activation == "gelu"


def test_seq_len_override():
    assert load_model("gpt3-175b", seq_len=4096).seq_length == 4096
    assert load_model("gpt3-175b", seq_len=None).seq_length == 2048
    with pytest.raises(InputError, match="--seq-len"):
        load_model("gpt3-175b", seq_len=0)


def test_model_yaml(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "name": "mine",
                "num_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 8,
                "num_query_groups": 2,
                "vocab_size": 1000,
                "seq_length": 128,
                "activation": "swiglu",
                "ffn_hidden_size": 512,
                "tie_embeddings": False,
            }
        )
    )
    m = load_model(str(p))
    assert (m.name, m.kv_heads, m.kv_size, m.ffn, m.tie_embeddings) == ("mine", 2, 64, 512, False)


@pytest.mark.parametrize(
    "change,key",
    [
        ({"num_layers": -1}, "num_layers"),
        ({"hidden_size": "big"}, "hidden_size"),
        ({"activation": "relu"}, "activation"),
        ({"num_attention_heads": 7}, "num_attention_heads"),  # 256 % 7
        ({"num_query_groups": 3}, "num_query_groups"),  # 8 % 3
        ({"dropout": 0.1}, "dropout"),  # unknown key
    ],
)
def test_bad_model_yaml_names_the_key(tmp_path, change, key):
    data = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1000, "seq_length": 128}
    data.update(change)
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as e:
        load_model(str(p))
    assert str(p) in str(e.value) and key in str(e.value)


def test_unknown_and_missing_models(tmp_path):
    with pytest.raises(InputError, match=r"unknown model 'gpt5'.*gpt3-175b"):
        load_model("gpt5")
    with pytest.raises(InputError, match="no such file"):
        load_model(str(tmp_path / "nope.yaml"))
    with pytest.raises(InputError, match="no such file"):
        load_model(str(tmp_path / "config.json"))


# ------------------------------------------------------------ Hugging Face config.json

GPT2_CONFIG = {  # huggingface.co/gpt2/blob/main/config.json (abridged)
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": None,
    "n_layer": 12,
    "n_positions": 1024,
    "layer_norm_epsilon": 1e-05,
    "vocab_size": 50257,
}
LLAMA2_7B_CONFIG = {  # meta-llama/Llama-2-7b-hf
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
MISTRAL_7B_CONFIG = {  # mistralai/Mistral-7B-Instruct-v0.2 (v0.1's 4096-token sliding window: test_hf_unsupported)
    "architectures": ["MistralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def write_json(tmp_path, name, cfg) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d / "config.json")


def test_hf_gpt2(tmp_path):
    m = load_model(write_json(tmp_path, "gpt2", GPT2_CONFIG))
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads, m.ffn) == (12, 768, 12, 12, 3072)
    assert (m.vocab_size, m.seq_length, m.activation) == (50257, 1024, "gelu")
    assert m.tie_embeddings and m.normalization == "LayerNorm" and m.position_embedding_type == "learned_absolute"
    assert params.total_params(m) == 124_439_808  # GPT-2 small, as counted by transformers


def test_hf_llama(tmp_path):
    m = load_model(write_json(tmp_path, "llama", LLAMA2_7B_CONFIG))
    assert (m.activation, m.tie_embeddings, m.normalization, m.position_embedding_type) == (
        "swiglu",
        False,
        "RMSNorm",
        "rope",
    )
    assert (m.ffn, m.seq_length) == (11008, 4096)
    assert params.total_params(m) == 6_738_415_616
    assert m == load_model("llama2-7b").model_copy(update={"name": m.name})


def test_hf_mistral_gqa(tmp_path):
    m = load_model(write_json(tmp_path, "mistral", MISTRAL_7B_CONFIG))
    assert (m.kv_heads, m.kv_size, m.ffn, m.seq_length) == (8, 1024, 14336, 32768)
    assert not m.tie_embeddings and m.activation == "swiglu"
    assert m.rope_theta == 1_000_000.0  # the config's rotary base, not the 10000 default
    assert params.total_params(m) == 7_241_732_096  # Mistral 7B
    assert load_model(write_json(tmp_path, "m2", MISTRAL_7B_CONFIG), seq_len=4096).seq_length == 4096


def test_hf_tie_flags(tmp_path):
    # a Llama-style config with tied embeddings (Qwen2-0.5B / Llama-3.2-1B style)
    tied = dict(MISTRAL_7B_CONFIG, model_type="qwen2", tie_word_embeddings=True)
    m = load_model(write_json(tmp_path, "tied", tied))
    assert m.tie_embeddings
    untied = load_model(write_json(tmp_path, "untied", MISTRAL_7B_CONFIG))
    assert params.total_params(untied) - params.total_params(m) == 32000 * 4096
    # no flag: transformers' default is tied (GPT-2); Llama-style families ship untied
    no_flag = {k: v for k, v in LLAMA2_7B_CONFIG.items() if k != "tie_word_embeddings"}
    assert not load_model(write_json(tmp_path, "noflag", no_flag)).tie_embeddings
    assert (
        load_model(write_json(tmp_path, "gpt2", dict(GPT2_CONFIG, tie_word_embeddings=False))).tie_embeddings is False
    )


def test_hf_bad_configs(tmp_path):
    with pytest.raises(InputError, match="hidden_act"):
        load_model(write_json(tmp_path, "relu", dict(LLAMA2_7B_CONFIG, hidden_act="relu")))
    missing = {k: v for k, v in LLAMA2_7B_CONFIG.items() if k != "vocab_size"}
    with pytest.raises(InputError, match=r"config\.json: key 'vocab_size'"):
        load_model(write_json(tmp_path, "missing", missing))
    no_layers = {k: v for k, v in LLAMA2_7B_CONFIG.items() if k != "num_hidden_layers"}  # named as HF names it
    with pytest.raises(InputError, match="key 'num_hidden_layers' or 'n_layer' or 'num_layers': Field required"):
        load_model(write_json(tmp_path, "no-layers", no_layers))
    with pytest.raises(InputError, match="key 'num_hidden_layers': Input should be greater than or equal to 1"):
        load_model(write_json(tmp_path, "zero-layers", dict(LLAMA2_7B_CONFIG, num_hidden_layers=0)))
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "gpt2", "n_layer": 2,')
    with pytest.raises(InputError, match=r"bad\.json: line \d+ malformed JSON"):
        load_model(str(bad))


# ---------------------------------------------------------------------------- plans


def test_plan_defaults():
    plan, m = parse_plan("t=8,p=16", GPT3, 1024, 1536)
    assert plan == Plan(t=8, p=16, d=8)
    assert (plan.mb, plan.zero, plan.ckpt, plan.v, plan.schedule, plan.offload, plan.sp) == (
        1,
        0,
        "none",
        1,
        "1f1b",
        "none",
        0,
    )
    assert m == 1536 // 8
    assert parse_plan("mb=2", GPT3, 8, 16)[0].d == 8


def test_plan_parse_all_keys():
    text = "t=8, p=4, d=32, mb=2, zero=1, ckpt=FULL, v=2, schedule=interleaved, offload=none, sp=1"
    plan, m = parse_plan(text, GPT3, 1024, 1536)
    assert plan == Plan(8, 4, 32, 2, 1, "full", 2, "interleaved", "none", 1)
    assert m == 24


def test_v_implies_interleaved():
    assert resolve_plan({"p": 4, "v": 2}, 8).schedule == "interleaved"


PLANS = [
    Plan(),
    Plan(t=8, p=16, d=8, mb=1, ckpt="full"),
    Plan(t=4, p=4, d=64, mb=2, zero=2, ckpt="selective", v=3, schedule="interleaved", sp=1),
    Plan(t=1, p=1, d=1024, zero=3, offload="nvme"),
    Plan(t=8, p=4, d=32, layers=(23, 25, 25, 23), recompute=((20, 3), (25, 0), (0, 0), (1, 22))),
]


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_plan_string_round_trip(plan):
    text = plan.to_string()
    assert resolve_plan(parse_plan_items(text), plan.gpus) == plan
    # d left out is recomputed from the GPUs
    no_d = ",".join(x for x in text.split(",") if not x.startswith("d="))
    assert resolve_plan(parse_plan_items(no_d), plan.gpus) == plan


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_the_tables_plan_labels_parse_as_plans(plan):
    """What the plan tables print (autoplan.report.plan_label: the schedule as a bare name, e.g.
    ``...,ckpt=none,zbv,v=2``) is a plan --plan and --fix accept, the same plan."""
    from autoplan.report import plan_label

    label = plan_label(plan.to_dict(num_microbatches=1))
    assert resolve_plan(parse_plan_items(label), plan.gpus) == plan.replace(layers=None, recompute=None)


def test_plan_to_dict_has_the_json_keys():
    d = Plan(t=8, p=8, d=24, ckpt="full").to_dict(num_microbatches=96)
    assert list(d) == ["t", "p", "d", "mb", "num_microbatches", "zero", "ckpt", "v", "schedule", "offload", "sp"]


def test_layers_accept_dash_or_slash():
    assert (
        parse_plan_items("layers=24-24-24-24") == parse_plan_items("layers=24/24/24/24") == {"layers": (24, 24, 24, 24)}
    )


def test_chunk_layers_and_recompute():
    assert Plan(p=4).chunk_layers(10) == (3, 3, 2, 2)
    assert Plan(p=2, v=2, schedule="interleaved").chunk_layers(8) == (2, 2, 2, 2)
    assert Plan(p=2, ckpt="full").chunk_recompute(6) == ((3, 0), (3, 0))
    assert Plan(p=2, ckpt="selective").chunk_recompute(6) == ((0, 3), (0, 3))
    p = Plan(p=2, layers=(2, 4))
    assert p.chunk_layers(6) == (2, 4) and p.chunk_recompute(6) == ((0, 0), (0, 0))


@pytest.mark.parametrize(
    "text,gpus,B,needle",
    [
        ("t=64", 1024, 1536, "num_attention_heads=96"),  # t does not divide heads
        ("t=8,p=16", 1024, 1537, "global batch 1537 is not divisible"),  # B not divisible by d*mb
        ("t=8,p=16,mb=4", 1024, 1544, "d*mb = 8*4"),
        ("t=3", 1024, 1536, "does not divide the cluster's 1024 GPUs"),
        ("t=8,p=8,d=8", 1024, 1536, "t*p*d"),
        ("t=0", 8, 8, "key 't'"),
        ("mb=-1", 8, 8, "key 'mb'"),
        ("d=0", 8, 8, "d must be a positive integer"),
        ("zero=4", 8, 8, "zero must be 0, 1, 2 or 3"),
        ("zero=3,hsdp=3", 8, 8, "hsdp=3 must divide d=8"),  # a shard group that does not divide d
        ("zero=3,hsdp=8", 8, 8, "hsdp=8 must divide d=8 and lie between 2 and d-1"),
        ("zero=1,hsdp=2", 8, 8, "needs zero=2 or zero=3"),
        ("zero=3,hsdp=2,offload=cpu", 8, 8, "hsdp=2 with offload=cpu is not modelled"),
        ("zero=3,hsdp=two", 8, 8, "key 'hsdp': expected an integer"),
        ("sp=2,t=2", 8, 8, "sp must be 0 or 1"),
        ("sp=1", 8, 8, "needs t > 1"),
        ("ckpt=some", 8, 8, "key 'ckpt': expected one of none, selective, full"),
        ("schedule=zb", 8, 8, "key 'schedule'"),
        ("offload=disk", 8, 8, "key 'offload'"),
        ("tp=8", 8, 8, "unknown key 'tp'"),
        ("t=8,t=8", 8, 8, "given twice"),
        ("t", 8, 8, "expected key=value"),
        ("t=eight", 8, 8, "key 't': expected an integer"),
        ("", 8, 8, "empty plan"),
        ("p=4,v=2,schedule=1f1b", 8, 16, "v=2 needs schedule=interleaved"),
        ("p=8,v=2", 8, 12, "multiple of p=8"),  # m = 12 not a multiple of p
        ("p=4,v=5", 4, 8, "divide num_layers=96"),  # 96 % 20
        ("p=128", 128, 128, "exceed the model's 96 layers"),
        ("p=2,layers=40/40", 2, 8, "sum to num_layers=96"),
        ("p=2,layers=96", 2, 8, "expected p*v = 2"),
        ("p=2,layers=-48/48", 2, 8, "key 'layers'"),  # a minus sign is not a separator to drop
        ("p=2,layers=48//48", 2, 8, "key 'layers'"),
        ("p=2,layers=", 2, 8, "key 'layers'"),
        ("p=2,recompute=50:0/0:0", 2, 8, "exceeds its 48 layers"),
        ("zero=0,offload=cpu,d=8", 8, 8, "needs zero >= 1"),
        ("zero=1,offload=nvme", 8, 8, "needs zero=3"),
    ],
)
def test_plan_errors(text, gpus, B, needle):
    with pytest.raises(InputError) as e:
        parse_plan(text, GPT3, gpus, B)
    msg = str(e.value)
    assert msg.startswith("--plan: ") and needle in msg and "\n" not in msg


def test_gqa_kv_heads_limit_t():
    llama = load_model("llama2-70b")  # 64 heads, 8 KV groups
    assert plan_errors(llama, Plan(t=8, d=1), 8, 8) == []
    errs = plan_errors(llama, Plan(t=16, d=1), 16, 16)
    assert any("KV heads" in e for e in errs)


def test_several_errors_are_all_reported_on_one_line():
    with pytest.raises(InputError, match=r"and 1 more"):
        validate_plan(GPT3, Plan(t=64, p=1, d=16, mb=1), 1024, 1536)


def test_job_make_validates_and_counts_microbatches():
    from hwprofiles import load_cluster

    c = load_cluster("dgx-a100-80gb", 128)
    job = Job.make(GPT3, c, Plan(t=8, p=16, d=8), 1536)
    assert (job.m, job.seq) == (192, 2048)
    with pytest.raises(InputError):
        Job.make(GPT3, c, Plan(t=8, p=16, d=4), 1536)


def test_plan_kinds_are_enums_and_literals_that_agree():
    """Each plan kind has one list of values: the StrEnum, the Plan field's Literal and the
    parser's accepted strings are the same."""
    import dataclasses
    import typing

    from simulator import plan as plan_module
    from simulator.plan import CKPT_MODES, OFFLOADS, SCHEDULES, Offload, Plan, Recompute, Schedule

    hints = typing.get_type_hints(Plan, vars(plan_module))
    for field, enum, values in (
        ("ckpt", Recompute, CKPT_MODES),
        ("schedule", Schedule, SCHEDULES),
        ("offload", Offload, OFFLOADS),
    ):
        assert typing.get_args(hints[field]) == tuple(e.value for e in enum) == values
    assert {f.name for f in dataclasses.fields(Plan)} >= {"ckpt", "schedule", "offload"}
    assert Schedule.INTERLEAVED == "interleaved" and Recompute("full") is Recompute.FULL


@pytest.mark.parametrize(("model_type", "activation"), [("mistral", "swiglu"), ("llama", "swiglu"), ("gpt2", "gelu")])
def test_a_hugging_face_config_without_hidden_act_takes_its_config_classs_default(model_type, activation):
    """transformers' LlamaConfig, MistralConfig, Qwen2Config, ... default hidden_act to "silu": a
    Mistral config.json that leaves it out was planned as a gelu model (7.2B read as 5.4B)."""
    cfg = {
        "model_type": model_type,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
    }
    assert model_from_hf_config(cfg, "config.json").activation == activation
