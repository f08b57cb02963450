"""Bad input through the real CLI: exit 2 and one line ``autoplan: error: ...`` that names the
file / key, never a traceback (docs/design.md section 3)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from conftest import NODE_MAPPING as NODE
from conftest import run_cli

MODEL = {
    "name": "m",
    "num_layers": 4,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "vocab_size": 512,
    "seq_length": 64,
}
CLUSTER = {"name": "c", "nodes": 2, "node": "dgx-a100-80gb"}

# Input files: name -> text. "{dir}" in a case's arguments is the directory holding them.
FILES = {
    "malformed.yaml": "name: m\nnum_layers: [4, 8\nhidden_size: 128\n",
    "malformed_cluster.yaml": "name: c\nnodes: 2\n  node: dgx-a100-80gb\n",
    "unknown_key.yaml": yaml.safe_dump(dict(MODEL, dropout=0.1)),
    "typo_key.yaml": yaml.safe_dump({("num_layer" if k == "num_layers" else k): v for k, v in MODEL.items()}),
    "unknown_cluster_key.yaml": yaml.safe_dump(dict(CLUSTER, network={"topology": "fat-tree", "oversub": 2})),
    "wrong_type.yaml": yaml.safe_dump(dict(MODEL, hidden_size="big")),
    "wrong_type_cluster.yaml": yaml.safe_dump(dict(CLUSTER, nodes="many")),
    "negative.yaml": yaml.safe_dump(dict(MODEL, num_layers=-4)),
    "negative_node.yaml": yaml.safe_dump(dict(NODE, host_memory_GiB=-1)),
    "bad_gpu_node.yaml": yaml.safe_dump(dict(NODE, gpu="no-such-gpu")),
    "bad_node_cluster.yaml": yaml.safe_dump(dict(CLUSTER, node="no-such-node")),
    "no_nic_node.yaml": yaml.safe_dump({k: v for k, v in dict(NODE, nics_per_node=0).items() if k != "nic"}),
    "two_errors.yaml": yaml.safe_dump(dict(MODEL, hidden_size="big", num_layers=-4)),
    "kv_alias.yaml": yaml.safe_dump(dict(MODEL, num_kv_heads=2)),
    "nic_typo_node.yaml": yaml.safe_dump({("nic_per_node" if k == "nics_per_node" else k): v for k, v in NODE.items()}),
    "duplicate_key.yaml": yaml.safe_dump(MODEL) + "num_layers: 8\n",
    "duplicate_node_key.yaml": yaml.safe_dump(NODE) + "gpus_per_node: 4\n",
    "empty.yaml": "",
    "huge_layers.yaml": yaml.safe_dump(dict(MODEL, num_layers=10**20)),
    "bad.json": '{"model_type": "llama", "num_hidden_layers": 2,,}',
    "relu.json": json.dumps(
        {
            "model_type": "gpt2",
            "n_layer": 2,
            "n_embd": 64,
            "n_head": 4,
            "vocab_size": 100,
            "n_positions": 32,
            "activation_function": "relu",
        }
    ),
}

SIM = ["simulate", "--fidelity", "analytic"]
GOOD = ["--model", "tiny", "--cluster", "dgx-a100-80gb", "--global-batch", "16", "--plan", "t=2"]


def sim(**over: str) -> list[str]:
    """simulate with GOOD arguments, some replaced."""
    args = dict(zip(GOOD[::2], GOOD[1::2]))
    args.update({f"--{k.replace('_', '-')}": v for k, v in over.items()})
    return SIM + [x for kv in args.items() for x in kv]


GPT3_128 = dict(model="gpt3-175b", nodes="128", global_batch="1536")

# id -> (arguments, strings the message must contain)
CASES = {
    "malformed-model-yaml": (sim(model="{dir}/malformed.yaml"), ["malformed.yaml", "line 3", "malformed YAML"]),
    "malformed-cluster-yaml": (
        sim(cluster="{dir}/malformed_cluster.yaml"),
        ["malformed_cluster.yaml", "malformed YAML"],
    ),
    "malformed-json": (sim(model="{dir}/bad.json"), ["bad.json", "malformed JSON"]),
    "empty-yaml": (sim(model="{dir}/empty.yaml"), ["empty.yaml", "expected a mapping"]),
    "unknown-key": (sim(model="{dir}/unknown_key.yaml"), ["unknown_key.yaml", "'dropout'", "unknown key"]),
    "typo-key": (sim(model="{dir}/typo_key.yaml"), ["typo_key.yaml", "'num_layer'", "unknown key"]),
    "unknown-nested-key": (
        sim(cluster="{dir}/unknown_cluster_key.yaml"),
        ["unknown_cluster_key.yaml", "'network.oversub'"],
    ),
    "unknown-plan-key": (sim(plan="t=2,tp=2"), ["--plan", "'tp'"]),
    "wrong-type": (sim(model="{dir}/wrong_type.yaml"), ["wrong_type.yaml", "'hidden_size'", "integer", "'big'"]),
    "wrong-type-cluster": (
        sim(cluster="{dir}/wrong_type_cluster.yaml"),
        ["wrong_type_cluster.yaml", "'nodes'", "'many'"],
    ),
    "negative-size": (
        sim(model="{dir}/negative.yaml"),
        ["negative.yaml", "'num_layers'", "greater than or equal to 1"],
    ),
    "negative-node": (sim(cluster="{dir}/negative_node.yaml"), ["negative_node.yaml", "'host_memory_GiB'"]),
    "negative-batch": (sim(global_batch="-16"), ["--global-batch", "positive"]),
    "zero-nodes": (sim(nodes="0"), ["--nodes", "positive"]),
    "t-not-dividing-heads": (sim(**GPT3_128, plan="t=64,p=1"), ["--plan", "t=64", "num_attention_heads=96"]),
    "batch-not-divisible": (
        sim(**dict(GPT3_128, global_batch="1537"), plan="t=8,p=16"),
        ["--plan", "global batch 1537", "d*mb"],
    ),
    "unknown-model": (sim(model="gpt-5"), ["unknown model 'gpt-5'", "gpt3-175b"]),
    "unknown-cluster": (sim(cluster="dgx-z900"), ["unknown cluster 'dgx-z900'", "dgx-a100-80gb"]),
    "unknown-gpu-in-node": (sim(cluster="{dir}/bad_gpu_node.yaml"), ["bad_gpu_node.yaml", "'gpu'", "no-such-gpu"]),
    "unknown-node-in-cluster": (
        sim(cluster="{dir}/bad_node_cluster.yaml"),
        ["bad_node_cluster.yaml", "'node'", "no-such-node"],
    ),
    "unsupported-activation": (sim(model="{dir}/relu.json"), ["relu.json", "hidden_act", "relu"]),
    "multi-node-without-nics": (sim(cluster="{dir}/no_nic_node.yaml", nodes="2"), ["no_nic_node.yaml", "no NICs"]),
    "name-too-long": (sim(cluster="x" * 300), ["unknown cluster 'xxx"]),
    "missing-model-file": (sim(model="{dir}/nope.yaml"), ["nope.yaml", "no such file"]),
    "missing-cluster-file": (sim(cluster="{dir}/nope-cluster.yaml"), ["nope-cluster.yaml", "no such file"]),
    "missing-required-argument": (SIM + GOOD[:-2], ["--plan"]),
    "plot-needs-des": ([*sim(), "--plot", "{dir}/x.png"], ["--plot", "des"]),
    "plan-bad-fix": (["plan", *GOOD[:-2], "--fix", "t=2,pp=2"], ["--fix", "'pp'"]),
    "every-error-shown": (
        sim(model="{dir}/two_errors.yaml"),
        ["two_errors.yaml", "key 'num_layers': ", "key 'hidden_size': ", "'big'"],
    ),
    "model-name-case": (sim(model="llama3-8B"), ["unknown model 'llama3-8B' (did you mean 'llama3-8b'?)"]),
    "cluster-name-typo": (sim(cluster="dgx-h10"), ["unknown cluster 'dgx-h10' (did you mean 'dgx-h100'?)"]),
    "model-key-alias": (
        sim(model="{dir}/kv_alias.yaml"),
        ["kv_alias.yaml", "key 'num_kv_heads': unknown key (did you mean 'num_query_groups'?)"],
    ),
    "node-key-typo": (
        sim(cluster="{dir}/nic_typo_node.yaml"),
        ["key 'nic_per_node': unknown key (did you mean 'nics_per_node'?)", "key 'nics_per_node': "],
    ),
    "duplicate-model-key": (
        sim(model="{dir}/duplicate_key.yaml"),
        ["duplicate_key.yaml", "line 7", "key 'num_layers' given twice (first on line 4)"],
    ),
    "duplicate-node-key": (sim(cluster="{dir}/duplicate_node_key.yaml"), ["key 'gpus_per_node' given twice"]),
    # numbers as the documentation writes them (hwprofiles.number_text), within the models' bounds
    "plan-of-commas": (sim(plan=","), ["--plan", "no key=value item in ','"]),
    "full-width-digit-in-plan": (sim(plan="t=\uff12"), ["--plan", "key 't'", "integer"]),
    "full-width-batch": (sim(global_batch="\uff11\uff16"), ["--global-batch", "positive integer"]),
    "full-width-node-count": (["plan", *GOOD[:-2], "--nodes", "1,\uff12"], ["--nodes", "node count"]),
    "tokens-with-underscores": (["plan", *GOOD[:-2], "--tokens", "1_000"], ["--tokens", "positive number"]),
    "tokens-beyond-bound": (["plan", *GOOD[:-2], "--tokens", "1e300"], ["--tokens 1e+300: at most 1e+15"]),
    "price-without-tokens": (["plan", *GOOD[:-2], "--gpu-hour-price", "2"], ["--gpu-hour-price needs --tokens"]),
    "run-timeout-nan": (["run", "{dir}", "--timeout", "nan"], ["--timeout", "positive number", "'nan'"]),
    "empty-target-name": (
        ["emit", *GOOD, "-o", "{dir}/out", "--target", "torch,,megatron"],
        ["--target", "an empty name in 'torch,,megatron'"],
    ),
    "layers-beyond-bound": (sim(model="{dir}/huge_layers.yaml"), ["'num_layers'", "less than or equal to 10000"]),
    "seq-len-beyond-bound": (sim(seq_len=str(2**40)), ["--seq-len", "'seq_length'", "less than or equal"]),
    "long-input-shortened": (sim(plan="t=" + "1x" * 50000), ["key 't'", "characters left out) ... x1x1"]),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run every case once, a few at a time (each is a fresh interpreter)."""
    d = tmp_path_factory.mktemp("bad-inputs")
    for name, text in FILES.items():
        (d / name).write_text(text)

    def one(case):
        args = [a.replace("{dir}", str(d)) for a in CASES_AND_CONTROL[case][0]]
        return case, run_cli(*args)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, [*CASES, "control"]))


CASES_AND_CONTROL = dict(CASES, control=(sim(), []))  # the arguments the cases start from are good


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_exit_2_and_one_line(results, case):
    proc = results[case]
    needles = CASES[case][1]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("autoplan: error: "), lines[0]
    assert "internal error" not in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout == ""


def test_every_error_of_a_file_is_shown(results):
    line = results["every-error-shown"].stderr
    assert "more]" not in line and line.count("key '") == 2, line


def test_control_case_succeeds(results):
    proc = results["control"]
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# ------------------------------------------------------------------ error classes -> exit codes

from hwprofiles.errors import AutoplanError, FitError, InputError, PlanError, RunError, SpecError  # noqa: E402

ERROR_EXIT_CODES = [(AutoplanError, 1), (InputError, 2), (SpecError, 2), (PlanError, 2), (FitError, 3), (RunError, 1)]


@pytest.mark.parametrize("cls,code", ERROR_EXIT_CODES, ids=[c.__name__ for c, _ in ERROR_EXIT_CODES])
def test_each_error_class_maps_to_its_exit_code_through_main(monkeypatch, capsys, cls, code):
    import autoplan.cli as cli

    def fail(_args):
        raise cls(f"{cls.__name__} happened:\n  on two lines")

    monkeypatch.setitem(cli.HANDLERS, "run", fail)
    assert cls.exit_code == code
    assert cli.main(["run", "some-dir"]) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"autoplan: error: {cls.__name__} happened: on two lines\n"


def test_argparse_errors_and_search_errors_are_input_and_fit_errors():
    from autoplan.search import NoPlanFits
    from simulator.plan import parse_plan_items

    assert issubclass(NoPlanFits, FitError)
    with pytest.raises(PlanError, match="unknown key 'tp'"):
        parse_plan_items("tp=2")
    with pytest.raises(InputError, match="argument --global-batch"):
        from autoplan.cli import build_parser

        build_parser().parse_args(
            ["simulate", "--model", "tiny", "--cluster", "x", "--global-batch", "0", "--plan", "t=1"]
        )


def test_loaders_raise_spec_errors():
    from hwprofiles.load import load_cluster
    from simulator.model_files import load_model

    with pytest.raises(SpecError, match="unknown model 'gpt-5'"):
        load_model("gpt-5")
    with pytest.raises(SpecError, match="unknown cluster 'dgx-z900'"):
        load_cluster("dgx-z900")


# ------------------------------------------------------------------ diagnostics through logging


def test_diagnostics_are_plain_lines_on_stderr_and_quiet_hides_them(tmp_path, capsys):
    from autoplan.cli import main
    from autoplan.emit.export import TARGETS

    args = ["emit", "--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", "t=2,p=2"]
    assert main([*args, "-o", str(tmp_path / "a")]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()  # one summary per tool (tiny is GPT-style: torchtitan says why it wrote nothing)
    assert [line.split()[0] for line in lines if not line.startswith(" ")][:4] == list(TARGETS)
    assert lines[-1] == f"wrote 7 files to {tmp_path / 'a'}; run it with: autoplan run {tmp_path / 'a'}"
    assert len(out.splitlines()) == 7
    assert main(["-q", *args, "-o", str(tmp_path / "b")]) == 0
    out, err = capsys.readouterr()
    assert err == "" and len(out.splitlines()) == 7
    assert main(["-v", "-q", "emit"]) == 2
    assert capsys.readouterr().err.startswith(
        "autoplan: error: argument -q/--quiet: not allowed with argument -v/--verbose"
    )
    assert main([*args, "-o", str(tmp_path / "c")]) == 0  # the level is reset by every call
    assert capsys.readouterr().err.splitlines()[-1].startswith("wrote 7 files")


def test_verbose_and_quiet_work_after_the_command_too(tmp_path, capsys):
    from autoplan.cli import main

    args = ["emit", "--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", "t=2,p=2"]
    assert main([*args, "-o", str(tmp_path / "a"), "-q"]) == 0
    assert capsys.readouterr().err == ""
    assert main([*args, "--verbose", "-o", str(tmp_path / "b")]) == 0
    assert "wrote 7 files" in capsys.readouterr().err
    assert main([*args, "-o", str(tmp_path / "c"), "-v", "-q"]) == 2
    assert "emit: argument -q/--quiet: not allowed with argument -v/--verbose" in capsys.readouterr().err
    assert main(["-v", *args, "-o", str(tmp_path / "c"), "-q"]) == 2  # one before the command, one after
    assert capsys.readouterr().err == "autoplan: error: argument -q/--quiet: not allowed with argument -v/--verbose\n"
    assert not (tmp_path / "c").exists()


def test_no_fit_hint_is_a_warning_that_quiet_keeps():
    proc = run_cli(
        "-q",
        "simulate",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-80gb",
        "--global-batch",
        "8",
        "--plan",
        "t=8",
        "--fidelity",
        "analytic",
        "--json",
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("autoplan: the plan does not fit: it needs") and len(proc.stderr.splitlines()) == 1


def test_an_input_quoted_in_an_error_cannot_drive_the_terminal(tmp_path, capsys):
    """An unknown key holding ESC ]0; (retitle), BEL and U+202E (right-to-left override) is quoted
    with escapes: the error line holds no control character."""
    from autoplan import cli

    model = tmp_path / "m.yaml"
    model.write_text(
        'name: m\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 2\nvocab_size: 100\nseq_length: 32\n"a\\u001b]0;T\\u0007\\u202eX": 1\n'
    )
    assert cli.main(["plan", "--model", str(model), "--cluster", "localhost-cpu", "--global-batch", "8"]) == 2
    err = capsys.readouterr().err
    assert "key 'a\\x1b]0;T\\x07\\u202eX': unknown key" in err and err.isascii() and err.count("\n") == 1, err
