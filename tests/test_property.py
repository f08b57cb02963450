"""Property tests: whatever the parsers are fed, the outcome is a valid spec or a clean
InputError (one line), never another exception."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hwprofiles import ClusterSpec, InputError
from hwprofiles.load import build, cluster_from_mapping, load_cluster, node_from_mapping
from simulator.analytic import estimate
from simulator.job import Job
from simulator.model_files import is_hf_config, load_model, model_from_hf_config
from simulator.plan import PLAN_KEYS, Plan, parse_plan, plan_errors
from simulator.specs import ModelSpec

# example counts and seeds come from the profile (tests/conftest.py: ci, dev, long)
SETTINGS = settings()

TINY = load_model("tiny")  # 4 layers, 4 heads, seq 64
GPT3 = load_model("gpt3-175b")


def clean(err: InputError) -> None:
    msg = str(err)
    assert msg and "\n" not in msg and "Traceback" not in msg


# -------------------------------------------------------------------------- plans

small_int = st.integers(min_value=-3, max_value=130)
values = st.one_of(
    small_int.map(str),
    st.integers().map(str),
    st.sampled_from(
        [
            "none",
            "full",
            "selective",
            "FULL",
            "1f1b",
            "gpipe",
            "interleaved",
            "cpu",
            "nvme",
            "",
            " ",
            "x",
            "1.5",
            "1e3",
            "0x10",
            "-0",
            "+2",
            "1_0",
            "nan",
            "∞",
            "٣",
        ]
    ),
    st.lists(small_int, min_size=0, max_size=6).map(lambda xs: "/".join(map(str, xs))),
    st.lists(st.tuples(small_int, small_int), min_size=0, max_size=4).map(
        lambda xs: "/".join(f"{a}:{b}" for a, b in xs)
    ),
    st.text(max_size=8),
)
keys = st.one_of(
    st.sampled_from(PLAN_KEYS), st.sampled_from(["T", "tp", "pp", "", " t", "dp", "layer"]), st.text(max_size=4)
)
items = st.tuples(keys, st.sampled_from(["=", "==", ":", "", " = "]), values).map("".join)
plan_text = st.one_of(st.lists(items, max_size=8).map(",".join), st.text(max_size=40))


def check_plan(text: str, model: ModelSpec, gpus: int, B: int):
    try:
        plan, m = parse_plan(text, model, gpus, B)
    except InputError as e:
        clean(e)
        return None
    assert isinstance(plan, Plan)
    assert plan_errors(model, plan, gpus, B) == []
    assert plan.t * plan.p * plan.d == gpus and m * plan.d * plan.mb == B and m >= 1
    assert plan.ckpt in ("none", "selective", "full") and plan.zero in (0, 1, 2, 3) and plan.sp in (0, 1)
    layers = plan.chunk_layers(model.num_layers)
    assert sum(layers) == model.num_layers and min(layers) >= 1 and len(layers) == plan.p * plan.v
    if plan.layers is not None:
        # what the user wrote, number for number: no part dropped (a '-48' is not read as 48)
        (written,) = [c.partition("=")[2].strip() for c in text.split(",") if c.partition("=")[0].strip() == "layers"]
        parts = re.split(r"[-/]", written)
        assert all(x.strip() for x in parts) and plan.layers == tuple(int(x) for x in parts)
    return plan, m


@SETTINGS
@given(text=plan_text, gpus=st.sampled_from([1, 2, 4, 8, 16]), B=st.integers(min_value=1, max_value=64))
def test_random_plan_strings_tiny(text, gpus, B):
    check_plan(text, TINY, gpus, B)


@SETTINGS
@given(
    t=st.sampled_from([1, 2, 4, 8]),
    p=st.sampled_from([1, 2, 4]),
    mb=st.sampled_from([1, 2, 3]),
    zero=st.integers(0, 3),
    ckpt=st.sampled_from(["none", "selective", "full"]),
    v=st.sampled_from([1, 2]),
    schedule=st.sampled_from(["1f1b", "gpipe", "interleaved"]),
    offload=st.sampled_from(["none", "cpu", "nvme"]),
    sp=st.integers(0, 1),
    B=st.sampled_from([8, 16, 24, 32]),
    extra=plan_text,
)
def test_structured_plans_parse_or_fail_cleanly_and_valid_ones_estimate(
    t, p, mb, zero, ckpt, v, schedule, offload, sp, B, extra
):
    text = f"t={t},p={p},mb={mb},zero={zero},ckpt={ckpt},v={v},schedule={schedule},offload={offload},sp={sp}"
    if extra.startswith(","):
        text += extra
    cluster = load_cluster("dgx-a100-80gb", 1)
    got = check_plan(text, TINY, cluster.num_gpus, B)
    if got is None:
        return
    plan, _ = got
    # a valid plan is a valid input to the estimator: finite, positive numbers
    r = estimate(Job(TINY, cluster, plan, B))
    assert math.isfinite(r.step_time) and r.step_time > 0
    assert math.isfinite(r.peak_memory) and r.peak_memory > 0
    assert 0 <= r.bubble_fraction < 10


@SETTINGS
@given(text=plan_text)
def test_random_plan_strings_gpt3(text):
    check_plan(text, GPT3, 1024, 1536)


@settings(max_examples=max(1, settings.default.max_examples * 3 // 5))  # estimates are slower
@given(
    plan=st.builds(
        Plan,
        t=st.sampled_from([1, 2, 4, 8]),
        p=st.sampled_from([1, 2, 4]),
        d=st.sampled_from([1, 2, 3]),
        mb=st.integers(1, 4),
        zero=st.integers(0, 3),
        ckpt=st.sampled_from(["none", "selective", "full"]),
        v=st.integers(1, 3),
        schedule=st.sampled_from(["1f1b", "gpipe", "interleaved"]),
        offload=st.sampled_from(["none", "cpu", "nvme"]),
        sp=st.integers(0, 1),
    )
)
def test_plan_to_string_round_trip(plan):
    from simulator.plan import parse_plan_items, resolve_plan

    assert resolve_plan(parse_plan_items(plan.to_string()), plan.gpus) == plan


# ------------------------------------------------------------------ model mappings

any_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-10, max_value=10),
    st.integers(min_value=1, max_value=2**70),
    st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=10),
    st.sampled_from(["gelu", "swiglu", "silu", "gelu_new", "relu", "llama", "gpt2", "rope", "RMSNorm"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
MODEL_KEYS = list(ModelSpec.model_fields)
HF_KEYS = [
    "model_type",
    "n_embd",
    "n_layer",
    "n_head",
    "n_positions",
    "n_ctx",
    "n_inner",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "hidden_act",
    "activation_function",
    "tie_word_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "architectures",
    "_name_or_path",
    "multi_query_group_num",
    "d_model",
    "ffn_dim",
    "seq_length",
]
mapping_keys = st.one_of(st.sampled_from(MODEL_KEYS + HF_KEYS), st.text(max_size=6))


def valid_model_base() -> dict:
    return {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 512, "seq_length": 64}


def check_model_outcome(fn, *args) -> None:
    try:
        m = fn(*args)
    except InputError as e:
        clean(e)
        return
    assert isinstance(m, ModelSpec)
    assert m.hidden_size % m.num_attention_heads == 0 and m.num_attention_heads % m.kv_heads == 0
    assert min(m.num_layers, m.hidden_size, m.vocab_size, m.seq_length, m.ffn) >= 1


@SETTINGS
@given(data=st.dictionaries(mapping_keys, any_value, max_size=12), start_valid=st.booleans())
def test_random_model_mappings(data, start_valid):
    mapping = dict(valid_model_base(), **data) if start_valid else data
    check_model_outcome(build, ModelSpec, mapping, "m.yaml")
    check_model_outcome(model_from_hf_config, mapping, "dir/config.json")
    if is_hf_config(mapping):
        check_model_outcome(model_from_hf_config, mapping, "config.json")


@SETTINGS
@given(data=st.one_of(any_value, st.lists(any_value, max_size=3)))
def test_non_mapping_model_documents(data):
    check_model_outcome(build, ModelSpec, data, "m.yaml")


# ---------------------------------------------------------------- cluster mappings

NODE_KEYS = [
    "name",
    "gpu",
    "gpus_per_node",
    "intra_node",
    "pcie",
    "nics_per_node",
    "nic",
    "host_memory_GiB",
    "cpu_adam_GBps",
    "nvme",
    "backend",
    "compute_slots",
]
link_value = st.one_of(
    st.fixed_dictionaries(
        {"bandwidth_GBps": any_value},
        optional={"latency_us": any_value, "kind": any_value, "efficiency": any_value, "bandwidth_Gbps": any_value},
    ),
    any_value,
)
node_value = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=5),
        "gpu": st.one_of(st.sampled_from(["a100-sxm4-80gb", "h100-sxm5-80gb", "nope"]), any_value),
        "gpus_per_node": any_value,
        "intra_node": link_value,
        "pcie": link_value,
        "nics_per_node": any_value,
        "nic": link_value,
        "host_memory_GiB": any_value,
        "nvme": any_value,
        "backend": any_value,
        "compute_slots": any_value,
        "extra": any_value,
    },
)
GOOD_NODE = {
    "name": "n",
    "gpu": "a100-sxm4-80gb",
    "gpus_per_node": 8,
    "intra_node": {"bandwidth_GBps": 300},
    "pcie": {"bandwidth_GBps": 25},
    "nics_per_node": 8,
    "nic": {"bandwidth_Gbps": 200},
    "host_memory_GiB": 1024,
}


def check_cluster_outcome(fn, *args) -> None:
    try:
        c = fn(*args)
    except InputError as e:
        clean(e)
        return
    assert isinstance(c, ClusterSpec)
    assert c.num_gpus >= 1 and c.gpu.peak_flops() > 0
    if c.nodes > 1:
        assert c.node.nics_per_node > 0 and c.node.nic is not None


@SETTINGS
@given(
    name=any_value,
    nodes=any_value,
    node=st.one_of(
        node_value,
        st.builds(lambda d: dict(GOOD_NODE, **d), node_value),
        st.sampled_from(["dgx-a100-80gb", "dgx2-v100", "no-such-node", "", "../gpus/a100-sxm4-80gb"]),
        any_value,
    ),
    network=st.one_of(
        st.none(),
        any_value,
        st.fixed_dictionaries(
            {},
            optional={
                "topology": any_value,
                "oversubscription": any_value,
                "switch_radix": any_value,
                "bogus": any_value,
            },
        ),
    ),
    override=st.one_of(st.none(), st.integers(min_value=1, max_value=512)),
)
def test_random_cluster_mappings(name, nodes, node, network, override):
    data = {"name": name, "nodes": nodes, "node": node}
    if network is not None:
        data["network"] = network
    check_cluster_outcome(cluster_from_mapping, data, "c.yaml", override)


@SETTINGS
@given(node=st.builds(lambda d: dict(GOOD_NODE, **d), node_value))
def test_random_node_mappings(node):
    try:
        n = node_from_mapping(node, "n.yaml")
    except InputError as e:
        clean(e)
        return
    assert n.gpus_per_node >= 1 and n.gpu.memory_GiB > 0


# ------------------------------------------------------------- files on disk

file_text = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
    st.dictionaries(mapping_keys, any_value, max_size=8).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.dictionaries(st.sampled_from(HF_KEYS), any_value, max_size=8).map(lambda d: json.dumps(d, default=str)),
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@settings()
@given(text=file_text, suffix=st.sampled_from([".yaml", ".json", ".yml"]), raw=st.booleans())
def test_random_files(scratch, text, suffix, raw):
    path = scratch / f"input{suffix}"
    if raw:
        path.write_bytes(text.encode("utf-8", "surrogatepass")[:400] + b"\xff\xfe")
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    check_model_outcome(load_model, str(path))
    check_cluster_outcome(load_cluster, str(path))


@SETTINGS
@given(ref=st.one_of(st.text(max_size=20), st.text(min_size=250, max_size=300)))  # long: ENAMETOOLONG
def test_random_names(ref):
    check_model_outcome(load_model, ref)
    check_cluster_outcome(load_cluster, ref)
