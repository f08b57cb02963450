"""The Megatron export read by Megatron's own code.

In CI: megatron-core 0.16.1 (the ``frameworks`` extra) builds its ``TransformerConfig`` from the
emitted arguments the way Megatron-LM's ``core_transformer_config_from_args`` does (a flag is
the field of the same name; the few exceptions are spelled out in :func:`core_config`), runs
its own checks, and its own ``get_num_layers_to_build`` / pipeline layout give the layers each
pipeline rank builds. Megatron-LM's training arguments are not on PyPI: with MEGATRON_LM_PATH set
to a source checkout, ``test_megatron_lm_accepts_the_arguments`` also runs its ``parse_args`` +
``validate_args`` (tests/megatron_lm.py, in a subprocess, CUDA-only calls stubbed) with the
environment megatron_launch.sh exports.
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

import launchers
import pytest
from export_matrix import CASES, Case, job_of

from autoplan.emit.megatron import export_megatron
from autoplan.runtime.config import TrainSettings

FIELD = re.compile(r"^--([a-z0-9-]+)$")


def read_args(text: str) -> dict[str, Any]:
    """megatron_args.txt as {dest: value}: argparse's dest of ``--a-b`` is ``a_b``; a flag
    without a value is True."""
    tokens = shlex.split(text, comments=True)
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        match = FIELD.match(tokens[i])
        assert match, f"not a flag: {tokens[i]}"
        key = match.group(1).replace("-", "_")
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[key], i = tokens[i + 1], i + 2
        else:
            out[key], i = True, i + 1
    return out


def launch_env(script: str) -> dict[str, str | None]:
    """What megatron_launch.sh exports (None: unsets)."""
    env: dict[str, str | None] = {}
    for line in script.splitlines():
        if line.startswith("export "):
            key, value = line[len("export ") :].split("=", 1)
            env[key] = value
        elif line.startswith("unset "):
            env[line.split()[1]] = None
    return env


def launched_argv(files: dict[str, str], tmp: Path, **env: str) -> tuple[int, list[str], str]:
    """megatron_launch.sh run with a stand-in torchrun (tests/launchers.py): exit code, the
    arguments pretrain_gpt.py would get, stderr."""
    return launchers.launched_argv(
        files, "megatron_launch.sh", tmp, "/opt/megatron-lm/pretrain_gpt.py", MEGATRON_LM="/opt/megatron-lm", **env
    )


def virtual_stages(args: dict[str, Any]) -> int | None:
    """Megatron-LM's validate_args: vpp from the layout's segments or from the layers per
    virtual stage; None when 1."""
    p = int(args["pipeline_model_parallel_size"])
    if "pipeline_model_parallel_layout" in args:
        v = (args["pipeline_model_parallel_layout"].count("|") + 1) // p
    elif "num_layers_per_virtual_pipeline_stage" in args:
        v = int(args["num_layers"]) // p // int(args["num_layers_per_virtual_pipeline_stage"])
    else:
        v = 1
    return v if v > 1 else None


# get_device_arch_version() (megatron/training/utils/common_utils.py: the GPU's compute capability major)
# of the matrix's GPUs
DEVICE_ARCH_VERSION = {"a100": 8, "h100": 9}


def connections_refusal(args: dict[str, Any], connections: str | None, gpu_arch: int) -> str | None:
    """What Megatron-LM's ``validate_args`` (megatron/training/arguments.py at d98e8a6) asserts about
    CUDA_DEVICE_MAX_CONNECTIONS (``connections``: its value, None when unset) for the arguments
    ``args``, or None when it accepts it. Written from that source:

    - ``--use-torch-fsdp2`` (line 1048) and ``--use-megatron-fsdp`` (line 1166) assert it is not "1";
    - line 1453: ``if (args.tensor_model_parallel_size > 1 or args.context_parallel_size > 1) and
      get_device_arch_version() < 10``, unless Torch-FSDP2 or Megatron-FSDP is on, or
      ``--overlap-moe-expert-parallel-comm`` (both only warn), it asserts it is "1"."""
    fsdp = bool(args.get("use_torch_fsdp2") or args.get("use_megatron_fsdp"))
    if fsdp and connections == "1":
        return "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."
    tensor, context = int(args["tensor_model_parallel_size"]), int(args.get("context_parallel_size", 1))
    model_parallel = (tensor > 1 or context > 1) and gpu_arch < 10
    if model_parallel and not fsdp and not args.get("overlap_moe_expert_parallel_comm") and connections != "1":
        return (
            "Using tensor model parallelism or context parallelism require setting the environment variable "
            "CUDA_DEVICE_MAX_CONNECTIONS to 1"
        )
    return None


def core_config(args: dict[str, Any]) -> Any:
    """megatron-core's TransformerConfig as core_transformer_config_from_args builds it."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    ints = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "recompute_num_layers")
    ints += ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
    kw: dict[str, Any] = {k: int(args[k]) for k in ints if k in args}
    kw |= {k: args[k] for k in ("recompute_granularity", "recompute_method", "normalization") if k in args}
    kw |= {k: float(args[k]) for k in ("hidden_dropout", "attention_dropout")}
    kw["pipeline_model_parallel_layout"] = args.get("pipeline_model_parallel_layout")
    kw["virtual_pipeline_model_parallel_size"] = virtual_stages(args)
    kw["sequence_parallel"] = bool(args.get("sequence_parallel"))
    kw["add_bias_linear"] = not args.get("disable_bias_linear", False)
    kw["num_query_groups"] = int(args["num_query_groups"]) if args.get("group_query_attention") else None
    if args.get("swiglu"):
        kw |= {"activation_func": F.silu, "gated_linear_unit": True}
    if "attention_backend" in args:
        kw["attention_backend"] = AttnBackend[args["attention_backend"]]
    kw |= {"bf16": True, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16}
    if "fp8_format" in args:  # Megatron-LM's --fp8-format has dest "fp8"
        kw |= {"fp8": args["fp8_format"], "fp8_amax_history_len": int(args["fp8_amax_history_len"])}
        kw["fp8_amax_compute_algo"] = args["fp8_amax_compute_algo"]
        kw["fp8_param"] = bool(args.get("fp8_param_gather"))  # argument_utils.py: fp8_param = args.fp8_param_gather
    kw["apply_rope_fusion"] = False  # needs Transformer Engine, which a CPU machine has not
    return TransformerConfig(**kw)


def layers_built(cfg: Any) -> list[list[int]]:
    """Decoder layers each pipeline rank builds per virtual stage (megatron-core's own split)."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    p, v = cfg.pipeline_model_parallel_size, cfg.virtual_pipeline_model_parallel_size or 1
    layout = cfg.pipeline_model_parallel_layout
    if layout is not None:
        return [[layout.layout[r][s].count(LayerType.decoder) for s in range(v)] for r in range(p)]
    vp = cfg.virtual_pipeline_model_parallel_size is not None
    return [[get_num_layers_to_build(cfg, vp_stage=s if vp else None, pp_rank=r) for s in range(v)] for r in range(p)]


def planned_layers(plan: Any, num_layers: int) -> list[list[int]]:
    """The plan's layers per pipeline rank and virtual stage (looped: chunk c on rank c % p)."""
    sizes = plan.chunk_layers(num_layers)
    return [[sizes[s * plan.p + r] for s in range(plan.v)] for r in range(plan.p)]


@pytest.fixture(params=CASES, ids=lambda c: c.id)
def emitted(request):
    case: Case = request.param
    job = job_of(case)
    export = export_megatron(job, TrainSettings())
    assert export.refused is None and export.written is not None
    return job, export


def test_megatron_core_reads_the_plan(emitted):
    pytest.importorskip("megatron.core")
    job, export = emitted
    plan, n = export.written, job.model.num_layers
    args = read_args(export.files["megatron_args.txt"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = core_config(args)
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (plan.t, plan.p)
    assert cfg.context_parallel_size == plan.cp
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == plan.v
    assert cfg.sequence_parallel == bool(plan.sp)
    assert layers_built(cfg) == planned_layers(plan, n)
    assert (cfg.num_query_groups or cfg.num_attention_heads) == job.model.kv_heads
    assert cfg.gated_linear_unit == (job.model.activation == "swiglu")
    assert cfg.fp8 == ("hybrid" if plan.prec == "fp8" else None)  # TE's e4m3 forward / e5m2 backward recipe
    assert cfg.fp8_param == bool(plan.fp8ag)  # fp8 parameters, gathered in fp8
    rec = plan.chunk_recompute(n)
    full = max(f for f, _ in rec)
    if full:  # block method: the first N layers of every chunk, all of them recomputed in full
        assert (cfg.recompute_granularity, cfg.recompute_method) == ("full", "block")
        assert [min(cfg.recompute_num_layers, size) for size in plan.chunk_layers(n)] == [f for f, _ in rec]
        assert not any(s for _, s in rec)
    elif any(s for _, s in rec):  # selective: the attention core of every layer
        assert cfg.recompute_granularity == "selective" and cfg.recompute_modules == ["core_attn"]
        assert all(s == size for (_, s), size in zip(rec, plan.chunk_layers(n)))
    else:
        assert cfg.recompute_granularity is None
    assert int(args["micro_batch_size"]) == plan.mb and int(args["global_batch_size"]) == job.global_batch
    assert args.get("use_distributed_optimizer", False) == (plan.zero >= 1)
    assert args.get("data_parallel_sharding_strategy") == {2: "optim_grads", 3: "optim_grads_params"}.get(plan.zero)
    assert int(args.get("num_distributed_optimizer_instances", 1)) == (plan.replicas if plan.hsdp else 1)
    assert args.get("optimizer_cpu_offload", False) == (plan.offload == "cpu")
    if job.model.position_embedding_type == "rope":
        assert float(args["rotary_base"]) == job.model.rope_theta
    env = launch_env(export.files["megatron_launch.sh"])
    gpu_arch = DEVICE_ARCH_VERSION[job.cluster.node.gpu.name.split("-")[0]]
    assert connections_refusal(args, env.get("CUDA_DEVICE_MAX_CONNECTIONS"), gpu_arch) is None


def test_the_launcher_starts_a_real_job_or_a_smoke_test_and_nothing_by_default(tmp_path):
    """megatron_launch.sh as a node runs it: without data it stops with one line naming DATA_PATH
    (and MOCK_DATA); with DATA_PATH (weights and prefixes) and TOKENIZER it passes Megatron's
    --data-path, the Hugging Face tokenizer and a validation split; MOCK_DATA=1 runs the mock
    dataset; both save and resume checkpoints in the run dir and log to TensorBoard there, for the
    schedule's iterations unless TRAIN_ITERS says otherwise."""
    job = job_of(CASES[0])
    files = export_megatron(job, TrainSettings()).files
    code, argv, err = launched_argv(files, tmp_path)
    assert code != 0 and not argv and "DATA_PATH" in err and "MOCK_DATA=1" in err
    code, argv, err = launched_argv(
        files, tmp_path, DATA_PATH="0.7 /data/a_text_document 0.3 /data/b", TOKENIZER="gpt2"
    )
    assert code == 0, err
    i = argv.index("--data-path")
    assert argv[i + 1 : i + 5] == ["0.7", "/data/a_text_document", "0.3", "/data/b"]
    assert argv[argv.index("--tokenizer-type") + 1] == "HuggingFaceTokenizer" and "--mock-data" not in argv
    assert argv[argv.index("--tokenizer-model") + 1] == "gpt2" and argv[argv.index("--split") + 1] == "99,1,0"
    run_dir = tmp_path / "run"
    assert argv[argv.index("--save") + 1] == argv[argv.index("--load") + 1] == str(run_dir / "checkpoints")
    assert argv[argv.index("--tensorboard-dir") + 1] == str(run_dir / "tensorboard")
    code, argv, err = launched_argv(files, tmp_path, MOCK_DATA="1", TRAIN_ITERS="50")
    assert code == 0 and "--mock-data" in argv and argv[argv.index("--tokenizer-type") + 1] == "NullTokenizer"
    assert argv[argv.index("--train-iters") + 1] == "50"


def test_the_learning_rate_follows_the_models_published_recipe():
    """GPT-3 175B (Brown et al. 2020): peak 6e-5 down to 6e-6, warm-up over 375M tokens and cosine
    decay over 260B at 1536 x 2048 = 3,145,728 tokens per iteration: ceil(375e6 / 3,145,728) = 120
    and ceil(260e9 / 3,145,728) = 82,652 iterations, 300B tokens in ceil(...) = 95,368."""
    from autoplan.emit.schedule import training_schedule
    from simulator.model_files import load_model

    s = training_schedule(load_model("gpt3-175b"), 1536, TrainSettings())
    assert (s.lr, s.min_lr, s.warmup_iters, s.decay_iters, s.train_iters) == (6e-5, 6e-6, 120, 82_652, 95_368)
    assert "Brown et al. 2020" in s.source
    tiny = training_schedule(load_model("tiny"), 8, TrainSettings())
    assert (tiny.lr, tiny.train_iters, tiny.warmup_iters) == (TrainSettings().lr, 10_000, 100)


#: the Transformer Engine version Megatron-LM's checks see (its is_te_min_version): the oldest that megatron-core
#: 0.16.1 installs with (its dev extra: transformer-engine>=2.9.0a0,<2.12.0), so every check that a TE release
#: must pass is made as on a real node (on CPU, TE is absent and would read as 0.0.0)
TE_VERSION = "2.9.0"


@pytest.mark.skipif(not os.environ.get("MEGATRON_LM_PATH"), reason="MEGATRON_LM_PATH: no Megatron-LM checkout")
def test_megatron_lm_accepts_the_arguments(emitted, tmp_path):
    from megatron_lm import validate_megatron

    job, export = emitted
    plan, n = export.written, job.model.num_layers
    code, argv, err = launched_argv(export.files, tmp_path, MOCK_DATA="1")  # as megatron_launch.sh passes them
    assert code == 0, err
    env = {k: v for k, v in launch_env(export.files["megatron_launch.sh"]).items() if v is not None}
    ns = validate_megatron(argv, plan.gpus, env, os.environ["MEGATRON_LM_PATH"], te_version=TE_VERSION)
    assert ns.data_parallel_size == plan.d
    assert ns._probe["num_microbatches"] == job.m
    assert ns._probe["layers_per_stage"] == planned_layers(plan, n)
