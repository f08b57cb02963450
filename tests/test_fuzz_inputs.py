"""Fuzz the command line's inputs (issue 31, deliverable 4): model YAML, Hugging Face config.json,
node/cluster YAML and plan strings, driven through ``plan``, ``simulate`` and ``emit``.

Every example must end within 10 s in exit 0 with a result on stdout (or written files), or in
exit 2 (bad input) / 3 (no plan fits) with exactly one line ``autoplan: error: ...`` on stderr:
never a traceback, never "internal error", never a hang.

The CLI runs in-process (:func:`autoplan.cli.main` returns the exit code), so an example costs
milliseconds to a second rather than an interpreter start.

Profiles (hypothesis settings):

- default (CI): derandomized, a few examples per test, the whole file in well under a minute;
- ``AUTOPLAN_FUZZ=long``: 2000 random (not derandomized) examples per test, for a local run::

      AUTOPLAN_FUZZ=long .venv/bin/python -m pytest -q tests/test_fuzz_inputs.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import string
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import NODE_MAPPING
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.cli import main

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long",
    derandomize=False,
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PROFILE = "long" if os.environ.get("AUTOPLAN_FUZZ") == "long" else "ci"
FUZZ = settings.get_profile(PROFILE)

#: seconds an example may take, end to end (issue 31)
DEADLINE_S = 10.0

# ----------------------------------------------------------------------------------------------
# Running the CLI


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    """``autoplan ARGV`` in this process: (exit code, stdout, stderr, seconds)."""
    out, err = io.StringIO(), io.StringIO()
    env_debug = os.environ.pop("AUTOPLAN_DEBUG", None)  # internal errors as one line, not raised
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # --help/--version or argparse paths that exit
                code = e.code if isinstance(e.code, int) else 1
    finally:
        if env_debug is not None:
            os.environ["AUTOPLAN_DEBUG"] = env_debug
    return code, out.getvalue(), err.getvalue(), time.monotonic() - start


def check(argv: list[str], out_dir: Path | None = None) -> int:
    """Run ``argv`` and assert the contract: in time; exit 0 with a result, or 2/3 with one line."""
    code, out, err, took = run_cli(argv)
    shown = f"autoplan {' '.join(map(repr, argv))}\nexit {code}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    assert took < DEADLINE_S, f"took {took:.1f} s (> {DEADLINE_S} s)\n{shown}"
    assert "Traceback" not in err, shown
    assert "internal error" not in err, shown
    if code == 0:
        if out_dir is not None:
            assert out_dir.is_dir() and any(out_dir.iterdir()), f"emit wrote nothing\n{shown}"
        else:
            assert out.strip(), f"exit 0 but no result on stdout\n{shown}"
    else:
        assert code in (2, 3), shown
        lines = [ln for ln in err.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("autoplan: error: ")]
        assert len(errors) == 1, f"expected exactly one error line\n{shown}"
        assert lines[-1] == errors[0], f"the error line must be the last line on stderr\n{shown}"
    return code


@contextlib.contextmanager
def workdir():
    with tempfile.TemporaryDirectory(prefix="autoplan-fuzz-") as d:
        yield Path(d)


# ----------------------------------------------------------------------------------------------
# Strategies

ODD_TEXT = st.sampled_from(
    [
        "",
        " ",
        "a\nb",
        "x; rm -rf /tmp/nothing",
        "$(echo pwned)",
        "`id`",
        '"""',
        "'''",
        "trail\\",
        "#comment",
        "nul\x00byte",
        "é漢字🙂",
        "-1",
        "1e400",
        "nan",
        "inf",
        "0x10",
        "null",
        "~",
        "yes",
        "x" * 300,
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 3, 4, 7, 8, 16, 64, 128, 512, 4096, -1, 10**9, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    ODD_TEXT,
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=6), SCALARS, max_size=3),
)

TINY = {
    "name": "tiny",
    "num_layers": 4,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "ffn_hidden_size": 512,
    "vocab_size": 512,
    "seq_length": 64,
    "activation": "gelu",
    "tie_embeddings": True,
}
MODEL_KEYS = [
    *TINY,
    "num_query_groups",
    "position_embedding_type",
    "normalization",
    "rope_theta",
    "num_experts",
    "moe_router_topk",
    "num_kv_heads",
    "dropout",
]
NODE = {**NODE_MAPPING, "name": "fuzz-node"}
NODE_KEYS = [*NODE, "nvme", "backend", "cpu_adam_GBps", "efficiency", "nic_per_node"]
CLUSTER = {"name": "fuzz-cluster", "nodes": 2, "node": "dgx-a100-80gb", "network": {"topology": "fat-tree"}}
CLUSTER_KEYS = [*CLUSTER, "oversubscription", "measured"]
HF = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}
HF_KEYS = [*HF, "_name_or_path", "n_layer", "n_embd", "n_head", "n_positions", "num_local_experts", "torch_dtype"]


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """``base`` with a few keys dropped, replaced by random values, or added."""
    out = dict(base)
    for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        action = draw(st.sampled_from(["drop", "set", "set"]))
        if action == "drop":
            out.pop(key, None)
        else:
            out[key] = draw(VALUES)
    if draw(st.booleans()):
        out[draw(st.text(min_size=1, max_size=8))] = draw(SCALARS)
    return out


def dump_yaml(data: Any) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:  # e.g. a key yaml cannot write: fall back to a repr-ish document
        return json.dumps(data, default=str)


YAML_TEXT = st.one_of(
    st.sampled_from(
        [
            "",
            "---\n",
            "[1, 2, 3]\n",
            "just a string\n",
            "name: m\nnum_layers: [4, 8\n",
            "name: m\nname: n\nnum_layers: 4\n",
            "!!python/object/apply:os.system ['echo pwned']\n",
            "a: &x [*x]\n",
            "\x00\x01\x02",
            "key: value\n\tbad: tab\n",
        ]
    ),
    st.text(max_size=60),
)

PLAN_VALUES = st.one_of(
    st.sampled_from(["", "0", "1", "2", "4", "8", "-1", "1.5", "x", "full", "selective", "none", "1f1b"]),
    st.sampled_from(["interleaved", "gpipe", "zb", "zbv", "cpu", "nvme", "bf16", "fp8", "fp16", "a:b", "1-2/3"]),
    st.integers(min_value=-3, max_value=10**6).map(str),
    st.text(alphabet=string.printable, max_size=6),
)
PLAN_KEYS_ = st.one_of(
    st.sampled_from(
        ["t", "p", "d", "mb", "zero", "v", "sp", "hsdp", "cp", "ep", "fp8ag", "ckpt", "schedule", "offload", "prec"]
    ),
    st.sampled_from(["layers", "recompute", "T", "pp", "", " t "]),
    st.text(alphabet=string.ascii_letters + "_= ", max_size=5),
)
PLAN_ITEM = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", PLAN_KEYS_, PLAN_VALUES),
    st.text(alphabet=string.printable, max_size=8),
)
GOOD_ITEM = st.one_of(
    st.sampled_from(["t=1", "t=2", "t=4", "p=1", "p=2", "p=4", "mb=1", "mb=2", "zero=0", "zero=1", "zero=2"]),
    st.sampled_from(["zero=3", "ckpt=full", "ckpt=selective", "ckpt=none", "schedule=1f1b", "schedule=gpipe"]),
    st.sampled_from(["schedule=interleaved,v=2", "sp=1", "cp=2", "offload=cpu", "prec=bf16", "d=1", "d=2"]),
)
#: mostly plausible plans (to reach the simulator and emitter), some with garbage items among them
PLAN_TEXT = st.one_of(
    st.lists(GOOD_ITEM, min_size=1, max_size=4).map(",".join),
    st.lists(st.one_of(GOOD_ITEM, PLAN_ITEM), min_size=0, max_size=5).map(",".join),
)

TINY_JOB = ["--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8"]
SMALL_GPU_JOB = ["--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "8"]
GLOBAL_BATCH = st.sampled_from(["1", "2", "8", "16"])
SIM_FIDELITY = st.sampled_from(["des", "analytic"])


def file_arg(d: Path, name: str, text: str) -> str:
    p = d / name
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    return str(p)


def commands(job: list[str], plan: str, out: Path) -> list[tuple[list[str], Path | None]]:
    """The three commands for one job and plan string."""
    return [
        (["plan", *job, "--jobs", "1", "--top", "2", "--fidelity", "analytic"], None),
        (["simulate", *job, "--plan", plan], None),
        (["emit", *job, "--plan", plan, "--target", "torch", "-o", str(out)], out),
    ]


# ----------------------------------------------------------------------------------------------
# Tests


def test_fix_refuses_a_count_below_one() -> None:
    """Found by this fuzz: ``--fix cp=0`` ended in an internal ZeroDivisionError (--fix checked
    t, p, mb, v, d, ep but not cp); every counting key is now checked in one place."""
    for fix in ("cp=0", "cp=-2", "ep=0", "t=0"):
        assert check(["plan", *TINY_JOB, "--jobs", "1", "--top", "2", "--fidelity", "analytic", "--fix", fix]) == 2


@FUZZ
@given(plan=PLAN_TEXT, fidelity=SIM_FIDELITY)
def test_plan_strings(plan: str, fidelity: str) -> None:
    """Random ``key=value`` lists as --plan (simulate, emit) and --fix (plan), on the tiny model."""
    with workdir() as d:
        check(["simulate", *TINY_JOB, "--fidelity", fidelity, "--plan", plan])
        check(["emit", *TINY_JOB, "--plan", plan, "--target", "torch", "-o", str(d / "out")], d / "out")
        check(["plan", *TINY_JOB, "--jobs", "1", "--top", "2", "--fidelity", "analytic", "--fix", plan])


@FUZZ
@given(model=mutated(TINY, MODEL_KEYS), batch=GLOBAL_BATCH, plan=st.sampled_from(["t=1", "t=2", "p=2,mb=1", "zero=1"]))
def test_model_yaml(model: dict[str, Any], batch: str, plan: str) -> None:
    """A model YAML with keys dropped, mistyped or added, through plan, simulate and emit."""
    with workdir() as d:
        job = ["--model", file_arg(d, "model.yaml", dump_yaml(model)), "--cluster", "localhost-cpu"]
        job += ["--global-batch", batch]
        for argv, out in commands(job, plan, d / "out"):
            check(argv, out)


@FUZZ
@given(text=YAML_TEXT, which=st.sampled_from(["model", "cluster"]))
def test_yaml_text(text: str, which: str) -> None:
    """Raw, mostly broken YAML documents as a model file and as a cluster file."""
    with workdir() as d:
        path = file_arg(d, f"{which}.yaml", text)
        job = ["--model", path if which == "model" else "tiny"]
        job += ["--cluster", path if which == "cluster" else "localhost-cpu", "--global-batch", "8"]
        check(["simulate", *job, "--fidelity", "analytic", "--plan", "t=1"])


@FUZZ
@given(cfg=mutated(HF, HF_KEYS), fidelity=SIM_FIDELITY)
def test_hf_config(cfg: dict[str, Any], fidelity: str) -> None:
    """A Hugging Face config.json with keys dropped, mistyped or added (on one DGX H100)."""
    with workdir() as d:
        try:
            text = json.dumps(cfg, allow_nan=True)
        except (TypeError, ValueError):
            text = json.dumps(cfg, default=str)
        job = ["--model", file_arg(d, "config.json", text), *SMALL_GPU_JOB]
        check(["simulate", *job, "--fidelity", fidelity, "--plan", "t=2"])
        check(["emit", *job, "--plan", "t=2", "--target", "torch", "-o", str(d / "out")], d / "out")
        check(["plan", *job, "--jobs", "1", "--top", "2", "--fidelity", "analytic"])


@FUZZ
@given(node=mutated(NODE, NODE_KEYS), nodes=st.sampled_from([None, "1", "2"]))
def test_node_yaml(node: dict[str, Any], nodes: str | None) -> None:
    """A node YAML (given as --cluster, with or without --nodes) with keys dropped, mistyped or added."""
    with workdir() as d:
        job = ["--model", "tiny", "--cluster", file_arg(d, "node.yaml", dump_yaml(node)), "--global-batch", "16"]
        if nodes:
            job += ["--nodes", nodes]
        for argv, out in commands(job, "t=2,zero=1", d / "out"):
            check(argv, out)


@FUZZ
@given(cluster=mutated(CLUSTER, CLUSTER_KEYS), inline_node=mutated(NODE, NODE_KEYS), inline=st.booleans())
def test_cluster_yaml(cluster: dict[str, Any], inline_node: dict[str, Any], inline: bool) -> None:
    """A cluster YAML with keys dropped, mistyped or added; its node by name or inline."""
    if inline and "node" in cluster:
        cluster["node"] = inline_node
    with workdir() as d:
        job = ["--model", "tiny", "--cluster", file_arg(d, "cluster.yaml", dump_yaml(cluster)), "--global-batch", "16"]
        for argv, out in commands(job, "t=2", d / "out"):
            check(argv, out)


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", *TINY_JOB, "--plan", "t=2,p=2"],
        ["plan", *TINY_JOB, "--jobs", "1", "--top", "2"],
        ["simulate", "--model", "tiny", *SMALL_GPU_JOB, "--plan", "t=2"],
    ],
)
def test_known_good(argv: list[str]) -> None:
    """The fixed parts of the fuzz jobs work (a fuzz test that only ever sees errors proves little)."""
    assert check(argv) == 0
