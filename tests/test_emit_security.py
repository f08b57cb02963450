"""Issue 31, security: a string from an input never runs as code in a file ``autoplan emit`` writes.

A hostile model name (newlines, quotes, ``$()``, backticks, ``\"\"\"``, ``'''``, a trailing
backslash, ``#``, NUL, a line separator, 10 kB of text), from a model YAML or a Hugging Face
``config.json`` (``_name_or_path``), is either refused with one line (an InputError; exit 2 from the
command line, no traceback) or emitted so that every file parses with its own language's parser,
has the same code as for a plain name, and running the launch scripts with stand-in tools
(``PYTHON``, ``torchrun``, ``srun``, ``scontrol``) runs nothing injected: every injection here would
``touch`` a marker file. The emitters' quoting (:mod:`autoplan.emit.safe_text`) is checked on its
own with names that skip the load-time rule (:mod:`hwprofiles.names`), and with a hostile ``-o``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from autoplan.emit.export import TARGETS
from autoplan.emit.writer import write_run_dir
from hwprofiles.errors import InputError
from hwprofiles.load import load_cluster, load_gpu, load_node
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan

MARKER = "PWNED"
INJECT = f"touch {MARKER}"
HOSTILE_NAMES = {
    "newline": f"x\n{INJECT}\n",
    "carriage-return": f"x\r{INJECT}\r",
    "double-quote": f'x"; {INJECT}; echo "',
    "single-quote": f"x'; {INJECT}; echo '",
    "command-substitution": f"x$({INJECT})",
    "backticks": f"x`{INJECT}`",
    "triple-double-quote": f'x"""\nimport os; os.system("{INJECT}")\n"""',
    "triple-single-quote": f"x'''\nimport os; os.system('{INJECT}')\n'''",
    "trailing-backslash": "x\\",
    "backslash-newline": f"x\\\n{INJECT}\n",
    "hash": f"x # {INJECT}",
    "nul": f"x\x00\n{INJECT}\n",
    "line-separator": f"x\u2028{INJECT}",
    "10kB": "llama-" * 1700,
}
HWPROFILES = Path(__file__).resolve().parents[1] / "hwprofiles"
PLAIN_NAME = "tiny-llama"
JOB_NAME = re.compile(r"--job-name=autoplan-[A-Za-z0-9._+-]+$", re.MULTILINE)  # one word, no "/" (%x: a path)
PLAN, BATCH, CLUSTER = "t=2,p=2", 8, "localhost-cpu"  # 4 CPU ranks: every target writes its files
LLAMA = {  # a small Llama-style model: torchtitan writes it too (it refuses GPT-style models)
    "num_layers": 4,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "ffn_hidden_size": 256,
    "vocab_size": 512,
    "seq_length": 64,
    "activation": "swiglu",
    "tie_embeddings": False,
    "position_embedding_type": "rope",
    "normalization": "RMSNorm",
}
HF_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "vocab_size": 512,
    "max_position_embeddings": 64,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


# ------------------------------------------------------------------------------- inputs


def model_file(tmp_path: Path, source: str, name: str) -> Path:
    """A model named ``name``: a model YAML (key ``name``) or a Hugging Face config.json (``_name_or_path``)."""
    folder = tmp_path / "model"
    folder.mkdir(parents=True, exist_ok=True)
    if source == "yaml":
        path = folder / "model.yaml"
        path.write_text(yaml.safe_dump({"name": name, **LLAMA}))
    else:
        path = folder / "config.json"
        path.write_text(json.dumps({"_name_or_path": name, **HF_LLAMA}))
    return path


def job_of(model_path: Path | str) -> Job:
    model, cluster = load_model(str(model_path)), load_cluster(CLUSTER)
    plan, _ = parse_plan(PLAN, model, cluster.num_gpus, BATCH)
    return Job(model, cluster, plan, BATCH)


def emit(job: Job, out: Path) -> Path:
    write_run_dir(job, {"step_time_s": 1.0}, out, targets=TARGETS)
    return out


# ------------------------------------------------------------------------------- checks


class _BlankStrings(ast.NodeTransformer):
    """Every string constant made empty: what is left is the code."""

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        return ast.Constant("") if isinstance(node.value, str) else node


def parse(path: Path) -> str:
    """The file parsed by its own language's parser; returns its code (comments and strings taken out)."""
    text = path.read_text()
    assert "\x00" not in text, f"{path.name} holds a NUL"
    if path.suffix in (".sh", ".sbatch"):
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"{path.name}: {check.stderr}"
        code = [line for line in text.splitlines() if not line.lstrip().startswith("#") or line.startswith("#SBATCH")]
        return JOB_NAME.sub("--job-name=NAME", "\n".join(code))  # sbatch reads #SBATCH lines: code
    if path.suffix == ".py":
        return ast.dump(_BlankStrings().visit(ast.parse(text, path.name)))
    if path.name == "megatron_args.txt":
        shlex.split(text, comments=True)
        assert all(line.startswith(("#", "--")) for line in text.splitlines()), path.name
        return "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    loaders = {".json": json.loads, ".toml": tomllib.loads, ".yaml": yaml.safe_load, ".yml": yaml.safe_load}
    assert path.suffix in loaders, f"no parser for {path.name}"
    loaders[path.suffix](text)
    return ""


def stand_ins(tmp_path: Path) -> dict[str, str]:
    """The environment of a run with stand-in tools: each records its arguments in calls.log, exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("python", "torchrun", "srun", "scontrol"):
        path = bin_dir / tool
        path.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" {tool} "$@" "RUN_DIR=${{RUN_DIR-}}" >> "$CALLS"\n')
        path.chmod(0o755)
    return dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        PYTHON=str(bin_dir / "python"),
        CALLS=str(tmp_path / "calls.log"),
        MEGATRON_LM="/opt/Megatron-LM",
        MOCK_DATA="1",  # the tools' launchers want data and a tokenizer, or the smoke test
        TOKENIZER="/opt/tokenizer",
        SLURM_NNODES="1",
        SLURM_JOB_NODELIST="node0",
        SLURM_JOB_ID="1",
    )


def run_scripts(out: Path, tmp_path: Path) -> list[str]:
    """Run every shell script of ``out`` with the stand-ins from a fresh folder; return calls.log's lines."""
    env, cwd = stand_ins(tmp_path), tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    for script in sorted(out.glob("*.sh")) + sorted(out.glob("*.sbatch")):
        run = subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, f"{script.name}: {run.stderr}"
    return Path(env["CALLS"]).read_text().splitlines()


def assert_no_marker(tmp_path: Path) -> None:
    made = [p for p in tmp_path.rglob(MARKER)]
    assert not made, f"an injected command ran: {made}"


def assert_harmless(out: Path, tmp_path: Path, reference: Path) -> None:
    """Every file parses and has the code of ``reference`` (a plain name's run dir); the scripts,
    run with stand-in tools, run nothing injected and pass the run dir on unchanged."""
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(p.name for p in reference.iterdir())
    for name in written:
        code, plain = parse(out / name), parse(reference / name)
        assert code.replace(str(out), "RUN") == plain.replace(str(reference), "RUN"), f"{name}: the code changed"
    calls = run_scripts(out, tmp_path)
    assert_no_marker(tmp_path)
    assert {line for line in calls if line in ("python", "torchrun", "srun", "scontrol")} == {
        "python",
        "torchrun",
        "srun",
        "scontrol",
    }
    assert str(out.resolve()) in calls  # launch.sh: --run-dir; slurm.sbatch: RUN_DIR for srun
    assert not any(MARKER in line for line in calls), "an argument came from the name"


def assert_one_line_refusal(message: str, keys: tuple[str, ...]) -> None:
    assert message.isprintable() and len(message) < 400, message
    assert any(f"'{k}'" in message for k in keys), message


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    """The run dir of the same model under a plain name."""
    return emit(job_of(model_file(tmp_path / "plain", "yaml", PLAIN_NAME)), tmp_path / "plain" / "run")


# -------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("source", ["yaml", "hf"])
@pytest.mark.parametrize("label", HOSTILE_NAMES)
def test_a_hostile_model_name_is_refused_or_harmless(tmp_path, reference, source, label):
    path = model_file(tmp_path / "hostile", source, HOSTILE_NAMES[label])
    try:
        job = job_of(path)
    except InputError as e:
        assert_one_line_refusal(str(e), ("name", "_name_or_path"))
        return
    assert_harmless(emit(job, tmp_path / "hostile" / "run"), tmp_path / "hostile", reference)


@pytest.mark.parametrize("source", ["yaml", "hf"])
def test_the_command_line_refuses_with_one_line_or_writes_harmless_files(tmp_path, reference, source):
    path = model_file(tmp_path / "hostile", source, HOSTILE_NAMES["newline"])
    out = tmp_path / "hostile" / "run"
    done = run_cli("emit", "--model", path, "--cluster", CLUSTER, "--global-batch", BATCH, "--plan", PLAN, "-o", out)
    if done.returncode == 0:
        assert_harmless(out, tmp_path / "hostile", reference)
        return
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoplan: error: "), done.stderr
    assert not out.exists()


@pytest.mark.parametrize("label", HOSTILE_NAMES)
def test_the_files_quote_names_that_skip_the_load_rule(tmp_path, reference, label):
    """The second guard: a Job built in code (model and cluster names never validated) still emits
    files that parse, keep their code and run nothing."""
    job = job_of(model_file(tmp_path / "hostile", "yaml", PLAIN_NAME))
    name = HOSTILE_NAMES[label]
    cluster = job.cluster.model_copy(update={"name": name})  # model_copy does not validate
    job = Job(job.model.model_copy(update={"name": name}), cluster, job.plan, job.global_batch)
    assert_harmless(emit(job, tmp_path / "hostile" / "run"), tmp_path / "hostile", reference)


def test_a_hostile_output_folder_is_quoted(tmp_path, reference):
    """``-o`` reaches slurm.sbatch as RUN_DIR's default: it is one shell word there."""
    job = job_of(model_file(tmp_path / "hostile", "yaml", PLAIN_NAME))
    out = tmp_path / "hostile" / f"run \"$({INJECT})\" `{INJECT}` '; {INJECT}; '"
    emit(job, out)
    bash_n = subprocess.run(["bash", "-n", str(out / "slurm.sbatch")], capture_output=True, timeout=30)
    assert bash_n.returncode == 0
    calls = run_scripts(out, tmp_path / "hostile")
    assert_no_marker(tmp_path)
    assert f"RUN_DIR={out.resolve()}" in calls  # what srun is given


@pytest.mark.parametrize("kind", ["cluster", "node", "gpu"])
@pytest.mark.parametrize("label", ["newline", "command-substitution", "nul", "10kB"])
def test_hostile_hardware_names_are_refused_with_one_line(tmp_path, kind, label):
    """A cluster, node or GPU profile file whose ``name`` breaks the rule."""
    source = {"cluster": "clusters/vtrain-a100.yaml", "node": "nodes/localhost-cpu.yaml", "gpu": "gpus/cpu.yaml"}
    data = yaml.safe_load((HWPROFILES / source[kind]).read_text())
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump({**data, "name": HOSTILE_NAMES[label]}))
    load = {"cluster": load_cluster, "node": load_node, "gpu": load_gpu}[kind]
    with pytest.raises(InputError) as e:
        load(str(path))
    assert_one_line_refusal(str(e.value), ("name",))


def test_a_hugging_face_repo_id_is_a_name(tmp_path):
    """``org/model`` names are kept (a Hugging Face repo id); Slurm's job name, which ``%x`` puts
    into the output file's path, has no ``/``."""
    job = job_of(model_file(tmp_path, "hf", "meta-llama/Llama-3.1-8B+ft_v2.0"))
    assert job.model.name == "meta-llama/Llama-3.1-8B+ft_v2.0"
    out = emit(job, tmp_path / "run")
    assert "model meta-llama/Llama-3.1-8B+ft_v2.0," in (out / "launch.sh").read_text()
    assert "#SBATCH --job-name=autoplan-meta-llama_Llama-3.1-8B+ft_v2.0\n" in (out / "slurm.sbatch").read_text()
