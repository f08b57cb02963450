"""``write_run_dir`` and ``autoplan emit``: every file is there and parses, each export says what it
runs and how that differs from the plan, the launch scripts pass what they should (no real tools:
tests/test_export_{megatron,deepspeed,torchtitan}.py load the files with the tools' own code)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli
from export_matrix import CASES

from autoplan.emit.export import one_stage_per_rank
from autoplan.emit.megatron import export_megatron, pipeline_layout
from autoplan.emit.writer import write_run_dir
from autoplan.runtime.config import TrainSettings
from hwprofiles.load import load_cluster
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan, parse_plan

FILES = {
    "plan.json",
    "launch.sh",
    "slurm.sbatch",
    "megatron_args.txt",
    "megatron_launch.sh",
    "ds_config.json",
    "deepspeed_setup.py",
    "torchtitan_config.py",
    "torchtitan_launch.sh",
}


def emit(tmp_path: Path, model: str, cluster: str, nodes: int, batch: int, plan_text: str, **kw) -> tuple[Job, Path]:
    m = load_model(model)
    c = load_cluster(cluster, nodes)
    plan, _ = parse_plan(plan_text, m, c.num_gpus, batch)
    job = Job(m, c, plan, batch)
    out = tmp_path / "run"
    write_run_dir(job, {"step_time_s": 1.5, "peak_memory_gib": 40.0}, out, **kw)
    return job, out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_run_dir_files_parse_and_record_every_export(tmp_path, case):
    job, out = emit(tmp_path, case.model, case.cluster, case.nodes, case.batch, case.plan)
    data = json.loads((out / "plan.json").read_text())
    assert data["plan"]["t"] == job.plan.t and data["num_microbatches"] == job.m
    assert data["prediction"]["step_time_s"] == 1.5 and data["world_size"] == job.plan.gpus
    written = {p.name for p in out.iterdir()}
    for record in data["exports"].values():
        assert set(record["files"]) <= written
        if "refused" in record:  # nothing written, and why
            assert record["files"] == [] and record["refused"]
        else:  # the plan it runs, and each way that differs from the plan, in plan.json and in the files
            assert record["exact"] == (not record["changes"]) and record["runs"]
            for name in record["files"]:
                text = (out / name).read_text()
                assert all(c in text for c in record["changes"]) and all(n in text for n in record["notes"])
                assert ("NOT the plan as given" in text) == (not record["exact"])
    refused = {
        "torchtitan": {"torchtitan_config.py", "torchtitan_launch.sh"},
        "deepspeed": {"ds_config.json", "deepspeed_setup.py"},
    }
    assert written == FILES - {
        f for tool, files in refused.items() if "refused" in data["exports"][tool] for f in files
    }
    for script in written:
        if script.endswith((".sh", ".sbatch")):
            assert subprocess.run(["bash", "-n", str(out / script)], timeout=30).returncode == 0
        if script.endswith(".py"):
            compile((out / script).read_text(), script, "exec")
    assert f"#SBATCH --nodes={case.nodes}" in (out / "slurm.sbatch").read_text()


def test_targets_choose_the_files(tmp_path):
    _, out = emit(tmp_path, "llama3-8b", "dgx-h100", 2, 64, "t=2,p=2", targets=("megatron",))
    assert {p.name for p in out.iterdir()} == {"plan.json", "megatron_args.txt", "megatron_launch.sh"}
    assert set(json.loads((out / "plan.json").read_text())["exports"]) == {"megatron"}


def test_gpt_models_are_refused_by_torchtitan_with_the_reason(tmp_path):
    _, out = emit(tmp_path, "gpt3-175b", "dgx-a100-80gb", 16, 256, "t=8,p=4,zero=1")
    record = json.loads((out / "plan.json").read_text())["exports"]["torchtitan"]
    assert "GPT-style" in record["refused"] and "LayerNorm" in record["refused"]
    assert not (out / "torchtitan_config.py").exists()


def test_one_stage_per_rank_keeps_each_ranks_layers():
    """Interleaved 7/9/8/8 on p=2 (rank 0 runs chunks 0 and 2, rank 1 chunks 1 and 3) -> 15/17."""
    plan = Plan(
        t=2, p=2, d=2, v=2, schedule="interleaved", layers=(7, 9, 8, 8), recompute=((1, 0), (0, 2), (3, 0), (0, 0))
    )
    updates = one_stage_per_rank(plan, 32)
    assert updates == {"v": 1, "schedule": "1f1b", "layers": (15, 17), "recompute": ((4, 0), (0, 2))}
    assert one_stage_per_rank(Plan(p=4, v=2, schedule="interleaved"), 32)["layers"] is None  # 8 per rank: uniform


def test_megatron_layout_string():
    """E (embedding) before the first chunk's layers, L (loss) after the last (pipeline_parallel_layer_layout.py)."""
    assert pipeline_layout((13, 13, 14, 14, 13, 13)) == "Et*13|t*13|t*14|t*14|t*13|t*13L"


@pytest.mark.parametrize(
    "plan_text,runs,changed",
    [
        ("t=8,p=1,zero=1,recompute=0:88", "ckpt=selective", True),  # selective covers every layer
        ("t=8,p=1,zero=1,recompute=48:0", "recompute=48:0", False),  # block method: the first 48 layers
        ("t=8,p=2,zero=1,recompute=24:0/0:0", "recompute=24:0/24:0", True),  # the same N in every chunk
        ("t=8,p=2,zero=1,recompute=40:8/0:48", "ckpt=full", True),  # one granularity: full wins
        ("t=8,p=2,zero=1,ckpt=selective", "ckpt=selective", False),
    ],
)
def test_megatron_recomputes_at_least_what_the_plan_does(plan_text, runs, changed):
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", 16)
    plan, _ = parse_plan(plan_text, model, 128, 256)
    export = export_megatron(Job(model, cluster, plan, 256), TrainSettings())
    assert export.written is not None and runs in export.written.to_string()
    assert bool(export.changes) == changed
    for (f0, s0), (f1, s1) in zip(plan.chunk_recompute(96), export.written.chunk_recompute(96)):
        assert f1 + s1 >= f0 + s0 and f1 >= f0  # never less recomputation than planned: memory stays within


def _fake_tool(tmp_path: Path, name: str) -> dict[str, str]:
    """PATH with ``name`` printing its arguments and the environment it was given, one per line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(
        '#!/usr/bin/env bash\nprintf "%s\\n" "$@"\necho "CDMC=${CUDA_DEVICE_MAX_CONNECTIONS-unset}"\necho "PYTHONPATH=$PYTHONPATH"\n'
    )
    tool.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.parametrize(
    "plan_text,connections", [("t=8,p=6,zero=1", "1"), ("t=8,p=1,zero=3", "unset"), ("t=1,p=6,d=8,zero=1", "unset")]
)
def test_megatron_launch_passes_the_arguments_and_environment(tmp_path, plan_text, connections):
    _, out = emit(tmp_path, "llama2-70b", "dgx-a100-80gb", 6, 48, plan_text)
    env = dict(
        _fake_tool(tmp_path, "torchrun"),
        MEGATRON_LM="/opt/Megatron-LM",
        CUDA_DEVICE_MAX_CONNECTIONS="8",
        MASTER_ADDR="node0",
        MOCK_DATA="1",
    )
    run = subprocess.run(
        ["bash", str(out / "megatron_launch.sh"), "--exit-interval", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    words = run.stdout.splitlines()
    program = words.index("/opt/Megatron-LM/pretrain_gpt.py")
    args = shlex.split((out / "megatron_args.txt").read_text(), comments=True)
    assert words[program + 1 : program + 1 + len(args)] == args  # then the data and the job (test_export_megatron)
    assert words[-4:-2] == ["--exit-interval", "5"] and words[-2] == f"CDMC={connections}"
    missing = subprocess.run(
        ["bash", str(out / "megatron_launch.sh")],
        env={k: v for k, v in env.items() if k != "MEGATRON_LM"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode != 0 and "MEGATRON_LM" in missing.stderr


def test_torchtitan_launch_runs_the_config_module(tmp_path):
    _, out = emit(tmp_path, "llama3-8b", "dgx-h100", 2, 64, "t=2,p=2,zero=2")
    run = subprocess.run(
        ["bash", str(out / "torchtitan_launch.sh"), "--training.steps", "7"],
        env=dict(_fake_tool(tmp_path, "torchrun"), MASTER_ADDR="node0", MOCK_DATA="1", TOKENIZER="/opt/tokenizer"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    words = run.stdout.splitlines()
    start = words.index("-m") + 1
    assert words[start : start + 5] == [
        "torchtitan.train",
        "--module",
        "torchtitan_config",
        "--config",
        "autoplan_config",
    ]
    assert words[-4:-2] == ["--training.steps", "7"]  # the caller's overrides last: they win
    assert words[-1].startswith(f"PYTHONPATH={out}")


def test_emit_for_other_tools_without_the_torch_program(tmp_path):
    """offload=nvme is beyond autoplan's own program; --target megatron,deepspeed still writes, and names the changes."""
    args = ["emit", "--model", "gpt-1t", "--cluster", "dgx-a100-80gb", "--nodes", "16", "--global-batch", "256"]
    args += ["--plan", "t=8,p=1,zero=3,offload=nvme,ckpt=full", "-o", str(tmp_path / "run")]
    refused = run_cli(*args)
    assert refused.returncode == 2 and "--target" in refused.stderr
    ok = run_cli(*args, "--target", "megatron,deepspeed")
    assert ok.returncode == 0, ok.stderr
    assert "offload=nvme -> offload=cpu" in ok.stderr and "predicted (analytic)" in ok.stderr
    assert not (tmp_path / "run" / "launch.sh").exists()
    bad = run_cli(*args[:-1], str(tmp_path / "other"), "--target", "megatron,colossalai")
    assert bad.returncode == 2 and "unknown target colossalai" in bad.stderr and "Traceback" not in bad.stderr


def test_the_other_tools_are_predicted_with_their_own_memory_layout(tmp_path):
    """With the torch program among the targets, plan.json predicts the program (fp32 parameters and
    its ZeRO-1 buffers: the main job's plan needs 120 GiB), but DeepSpeed's closest plan is priced
    as DeepSpeed keeps its states (bf16 weights, fp32 master and moments sharded: it fits)."""
    args = ["emit", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "128", "--global-batch", "1536"]
    args += ["--plan", "t=4,p=8,mb=2,zero=1,v=6,schedule=interleaved,sp=1", "-o", str(tmp_path / "run")]
    done = run_cli(*args)
    assert done.returncode == 3, done.stderr  # written, but a tool's plan does not fit: as simulate says it
    program = json.loads((tmp_path / "run" / "plan.json").read_text())["prediction"]
    assert not program["fits"]
    assert "does NOT fit in 75 GiB (it keeps fp32 parameters and gradients" in done.stderr
    assert "run it with" not in done.stderr  # no advice to run what does not fit
    deepspeed = next(line for line in done.stderr.splitlines() if "predicted (analytic)" in line and "s/step" in line)
    assert ", fits in 75 GiB" in deepspeed, deepspeed


def _launch_command(out: Path, **env: str) -> subprocess.CompletedProcess:
    """Run launch.sh with PYTHON=echo: prints the torchrun command it would execute."""
    full = dict(os.environ, PYTHON="echo", **env)
    return subprocess.run(
        ["bash", str(out / "launch.sh"), "--steps", "3"], env=full, capture_output=True, text=True, timeout=30
    )


def test_launch_sh_single_and_multi_node(tmp_path):
    _, out = emit(tmp_path, "llama3-8b", "dgx-h100", 2, 64, "t=4,p=2,d=2")
    single = _launch_command(out, NNODES="1", NPROC_PER_NODE="16")
    assert single.returncode == 0, single.stderr
    assert "--standalone" in single.stdout and "--nproc-per-node 16" in single.stdout
    multi = _launch_command(out, NODE_RANK="1", MASTER_ADDR="node0", MASTER_PORT="12345")
    words = multi.stdout.split()
    assert multi.returncode == 0, multi.stderr
    assert words[words.index("--nnodes") + 1] == "2" and words[words.index("--node-rank") + 1] == "1"
    assert words[words.index("--rdzv-endpoint") + 1] == "node0:12345"
    assert words[words.index("--nproc-per-node") + 1] == "8"
    assert words[:3] == ["-m", "torch.distributed.run", "--nnodes"]
    tail = words[len(words) - words[::-1].index("-m") :]
    assert tail[:3] == ["autoplan.runtime.train", "--", "--run-dir"] and tail[-2:] == ["--steps", "3"]
    wrong = _launch_command(out, NNODES="3")
    assert wrong.returncode == 2 and "needs t*p*d = 16" in wrong.stderr


@pytest.mark.parametrize(
    "plan_text,mode,overlap",
    [
        ("d=8", "ddp", True),  # DDP reduces bucket by bucket during the backward
        ("d=8,zero=2", "fsdp", True),  # FSDP2 reduce-scatters per layer during the backward
        ("t=2,d=4", "manual", False),  # manual all-reduce after the last backward
        ("d=8,zero=1", "manual", False),  # ZeRO-1's reduce-scatter after the last backward
        ("t=8", "none", False),  # nothing to reduce, so nothing overlaps
    ],
)
def test_prediction_of_the_emitted_program_prices_its_reduction(plan_text, mode, overlap):
    """The run dir's prediction is for the program as emitted: no DP overlap where it reduces
    after the backward, and a slower step than the overlapped estimate when gradients fill
    more than one bucket (llama2-7b, 8 x A100: its 2 x 7e9/t bytes of gradients span many)."""
    from autoplan.runtime.support import dp_mode, program_job
    from simulator.analytic import estimate

    model, cluster = load_model("llama2-7b"), load_cluster("dgx-a100-80gb")
    plan, _ = parse_plan(plan_text, model, 8, 64)
    job = Job(model, cluster, plan, 64)
    assert dp_mode(plan) == mode
    emitted = program_job(job)
    assert emitted.runtime.dp_overlap is overlap
    # F.cross_entropy(logits.float()); with t > 1 the loss of each rank's V/t logits (autoplan.runtime.vocab_parallel)
    assert emitted.runtime.loss(plan.t) == ("split" if plan.t > 1 else "torch")
    assert emitted.runtime.weight_copy_bytes == (0.0 if mode == "fsdp" else 2.0)  # autocast's bf16 copies
    if not overlap and plan.d > 1:
        assert estimate(emitted).step_time > estimate(job).step_time


def test_one_data_parallel_rank_runs_as_the_manual_mode_and_its_plans_price_as_before():
    """d = 1 reduces nothing: its runtime is the manual mode's (one batch group with it), and
    the overlap flag it no longer sets moves none of its predictions (nothing to overlap)."""
    import dataclasses

    from autoplan.frameworks import load_framework
    from autoplan.runtime.support import program_job, program_runtime
    from simulator.analytic import estimate

    model, cluster = load_model("llama2-7b"), load_cluster("dgx-a100-80gb")
    base = load_framework("autoplan").base_runtime()
    for backend in ("nccl", "gloo"):
        for tensor, pipeline in ((False, False), (True, False), (True, True)):
            none = program_runtime(base, "none", backend, tensor, pipeline)
            assert none == program_runtime(base, "manual", backend, tensor, pipeline)
    for text in ("t=8", "t=4,p=2", "t=2,p=4,zero=1"):
        plan, _ = parse_plan(text, model, 8, 64)
        job = program_job(Job(model, cluster, plan, 64))
        overlapped = dataclasses.replace(job, runtime=dataclasses.replace(job.runtime, dp_overlap=True))
        assert estimate(job).step_time == estimate(overlapped).step_time


def test_prediction_of_the_emitted_program_prices_autocast_copies_only_where_they_exist():
    """bf16 weight copies: autocast on a GPU without FSDP, 2 bytes per parameter of the stage
    (autocast caches them until its context ends, recomputation or not: without a pipeline, the
    end of each microbatch's forward); FSDP2 gathers bf16 parameters instead, and a CPU rank runs
    fp32 without autocast."""
    import dataclasses

    from autoplan.runtime.support import program_job
    from simulator.analytic import estimate
    from simulator.cost.params import stage_params_per_rank
    from simulator.cost.stage_memory import layer_activations
    from simulator.cost.workload import padded_vocab_size

    model, gpu = load_model("llama2-7b"), load_cluster("dgx-a100-80gb")
    fsdp, _ = parse_plan("d=8,zero=3,mb=1", model, 8, 64)
    assert program_job(Job(model, gpu, fsdp, 64)).runtime.weight_copy_bytes == 0.0
    cpu = load_cluster("localhost-cpu")
    cpu8 = cpu.model_copy(update={"node": cpu.node.model_copy(update={"gpus_per_node": 8})})
    tp, _ = parse_plan("t=8,mb=1,ckpt=none", model, 8, 64)
    assert program_job(Job(model, cpu8, tp, 64)).runtime.weight_copy_bytes == 0.0

    def copies(ckpt: str) -> float:
        plan, _ = parse_plan(f"t=8,mb=1,ckpt={ckpt}", model, 8, 64)
        job = program_job(Job(model, gpu, plan, 64))
        without = dataclasses.replace(job, runtime=dataclasses.replace(job.runtime, weight_copy_bytes=0.0))
        return estimate(job).peak_memory - estimate(without).peak_memory

    psi = stage_params_per_rank(model, 8, 1, 32, True, True, padded_vocab_size(model, 8))
    # without recomputation the matmuls keep every copy for backward: all phases hold them
    assert copies("none") == pytest.approx(2 * psi, rel=1e-9)
    # fully recomputed, the copies are alive at the forward's end beside the loss forward's 6 bytes per
    # logit (L = 4096 tokens x 32,000 / 8 logits); without them the peak is the loss backward's 8 or a
    # layer's recompute, the larger
    logits = 4096 * padded_vocab_size(model, 8) / 8
    recompute = layer_activations(model, 1, 8, False, 2, kernels="eager")[2]
    assert copies("full") == pytest.approx(2 * psi + 6 * logits - max(8 * logits, recompute), rel=1e-9)


def test_each_tool_whose_plan_does_not_fit_is_named_and_emit_exits_3(tmp_path):
    """Every tool's files are written for the plan as its framework runs it; each one whose plan is
    predicted not to fit gets its own warning line (Megatron's went unsaid), and the exit is 3."""
    args = ["emit", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "16", "--global-batch", "1536"]
    done = run_cli(*args, "--plan", "t=1,p=1", "--framework", "megatron", "-o", str(tmp_path / "run"))
    assert done.returncode == 3, done.stderr
    said: dict[str, str] = {}  # each tool's lines: its own, then the indented ones under it
    tool = ""
    for line in done.stderr.splitlines():
        if line.startswith(" "):
            said[tool] += line
        else:
            tool = line.split()[0]
            said[tool] = line
    assert [t for t, text in said.items() if "does NOT fit" in text] == ["torch", "megatron"], done.stderr
    assert (tmp_path / "run" / "megatron_args.txt").is_file() and "run it with" not in done.stderr
