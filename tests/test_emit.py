"""``write_run_dir``: every file is there, parses, and carries the plan (no torch needed)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from autoplan.emit.writer import write_run_dir
from hwprofiles.load import load_cluster
from simulator.job import Job
from simulator.plan import parse_plan
from simulator.specs import load_model

FILES = {"plan.json", "launch.sh", "slurm.sbatch", "megatron_args.txt", "deepspeed_config.json", "torchtitan.toml"}

# The subset of Megatron-LM's arguments (megatron/training/arguments.py) the emitter uses.
MEGATRON_FLAGS = {
    "store_true": [
        "--group-query-attention",
        "--swiglu",
        "--disable-bias-linear",
        "--untie-embeddings-and-output-weights",
        "--mock-data",
        "--sequence-parallel",
        "--use-distributed-optimizer",
        "--use-megatron-fsdp",
        "--no-gradient-accumulation-fusion",
        "--optimizer-cpu-offload",
        "--bf16",
    ],
    int: [
        "--num-layers",
        "--hidden-size",
        "--num-attention-heads",
        "--num-query-groups",
        "--ffn-hidden-size",
        "--seq-length",
        "--max-position-embeddings",
        "--vocab-size",
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--num-layers-per-virtual-pipeline-stage",
        "--micro-batch-size",
        "--global-batch-size",
        "--recompute-num-layers",
        "--seed",
        "--train-iters",
        "--log-interval",
    ],
    float: [
        "--lr",
        "--adam-beta1",
        "--adam-beta2",
        "--adam-eps",
        "--weight-decay",
        "--clip-grad",
        "--attention-dropout",
        "--hidden-dropout",
        "--optimizer-offload-fraction",
    ],
    str: [
        "--position-embedding-type",
        "--normalization",
        "--tokenizer-type",
        "--pipeline-model-parallel-layout",
        "--data-parallel-sharding-strategy",
        "--ckpt-format",
        "--recompute-granularity",
        "--recompute-method",
        "--optimizer",
    ],
}

# torchtitan's JobConfig sections and the fields the emitter may set (torchtitan 0.2.2 config/job_config.py).
TORCHTITAN_FIELDS = {
    "job": {"dump_folder", "description"},
    "model": {"name", "flavor"},
    "optimizer": {"name", "lr", "beta1", "beta2", "eps", "weight_decay"},
    "training": {
        "local_batch_size",
        "global_batch_size",
        "seq_len",
        "max_norm",
        "steps",
        "mixed_precision_param",
        "mixed_precision_reduce",
        "enable_cpu_offload",
        "dataset",
    },
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "pipeline_parallel_layers_per_stage",
        "module_fqns_per_model_part",
        "context_parallel_degree",
    },
    "activation_checkpoint": {"mode", "selective_ac_option"},
}


def megatron_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for kind, flags in MEGATRON_FLAGS.items():
        for f in flags:
            if kind == "store_true":
                ap.add_argument(f, action="store_true")
            else:
                ap.add_argument(f, type=kind)
    return ap


def emit(tmp_path: Path, model: str, cluster: str, nodes: int, batch: int, plan_text: str) -> tuple[Job, Path]:
    m = load_model(model)
    c = load_cluster(cluster, nodes)
    plan, _ = parse_plan(plan_text, m, c.num_gpus, batch)
    job = Job(m, c, plan, batch)
    out = tmp_path / "run"
    files = write_run_dir(job, {"step_time_s": 1.5, "peak_memory_gib": 40.0}, out)
    assert {f.name for f in files} == FILES
    return job, out


CASES = [
    ("gpt3-175b", "dgx-a100-80gb", 96, 1536, "t=8,p=8,mb=1,zero=1,ckpt=full,v=2,schedule=interleaved,sp=1"),
    ("llama3-8b", "dgx-h100", 2, 64, "t=2,p=2,mb=2,zero=0,ckpt=selective,schedule=gpipe"),
    ("llama2-70b", "dgx-a100-80gb", 4, 32, "t=8,p=1,zero=3,offload=cpu,ckpt=full"),
    ("gpt3-175b", "dgx-a100-80gb", 16, 256, "t=8,p=4,zero=2,layers=20/28/28/20,recompute=4:0/2:2/0:0/0:4"),
]


@pytest.mark.parametrize("model,cluster,nodes,batch,plan_text", CASES)
def test_run_dir_files_parse_and_carry_the_plan(tmp_path, model, cluster, nodes, batch, plan_text):
    job, out = emit(tmp_path, model, cluster, nodes, batch, plan_text)
    plan, m = job.plan, job.m

    data = json.loads((out / "plan.json").read_text())
    assert data["plan"]["t"] == plan.t and data["num_microbatches"] == m and data["prediction"]["step_time_s"] == 1.5
    assert data["model"]["num_layers"] == job.model.num_layers and data["world_size"] == plan.gpus

    for script in ("launch.sh", "slurm.sbatch"):
        assert subprocess.run(["bash", "-n", str(out / script)], timeout=30).returncode == 0
    assert f"#SBATCH --nodes={nodes}" in (out / "slurm.sbatch").read_text()

    args = megatron_parser().parse_args(shlex.split((out / "megatron_args.txt").read_text(), comments=True))
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (plan.t, plan.p)
    assert (args.micro_batch_size, args.global_batch_size) == (plan.mb, job.global_batch)
    assert args.sequence_parallel == bool(plan.sp)
    assert args.use_distributed_optimizer == (plan.zero >= 1)
    assert args.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}.get(plan.zero)
    assert args.optimizer_cpu_offload == (plan.offload == "cpu")
    granularity = {"none": None, "selective": "selective", "full": "full"}[plan.ckpt]
    assert args.recompute_granularity == ("full" if plan.recompute else granularity)
    if plan.v > 1:
        assert args.num_layers_per_virtual_pipeline_stage == job.model.num_layers // (plan.p * plan.v)
    if plan.layers:
        assert args.pipeline_model_parallel_layout.count("|") == len(plan.layers) - 1
    if plan.schedule == "gpipe":
        assert "schedule=gpipe" in (out / "megatron_args.txt").read_text()

    ds = json.loads((out / "deepspeed_config.json").read_text())
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * plan.d
    assert ds["train_micro_batch_size_per_gpu"] == plan.mb and ds["gradient_accumulation_steps"] == m
    assert ds["zero_optimization"]["stage"] == plan.zero
    assert ds["tensor_parallel"]["autotp_size"] == plan.t and ds["pipeline"]["stages"] == plan.p
    assert ("offload_optimizer" in ds["zero_optimization"]) == (plan.offload != "none")
    assert ("activation_checkpointing" in ds) == any(f for f, _ in plan.chunk_recompute(job.model.num_layers))
    assert ds["autoplan"]["plan"]["schedule"] == plan.schedule

    tt = tomllib.loads((out / "torchtitan.toml").read_text())
    for section, keys in tt.items():
        assert set(keys) <= TORCHTITAN_FIELDS[section], section
    par = tt["parallelism"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (plan.t, plan.p)
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == plan.d
    assert (
        par["pipeline_parallel_schedule"]
        == {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}[plan.schedule]
    )
    assert par["pipeline_parallel_microbatch_size"] == plan.mb
    assert tt["training"]["global_batch_size"] == job.global_batch
    assert tt["training"]["local_batch_size"] == job.global_batch // plan.d
    assert tt["activation_checkpoint"]["mode"] == plan.ckpt
    if plan.layers:
        parts = par["module_fqns_per_model_part"]
        assert [sum(x.startswith("layers.") for x in part) for part in parts] == list(plan.layers)
    if plan.zero >= 2:
        assert par["fsdp_reshard_after_forward"] == ("always" if plan.zero == 3 else "never")


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
        ("t=8", "none", True),  # nothing to reduce
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
    if not overlap and plan.d > 1:
        assert estimate(emitted).step_time > estimate(job).step_time
