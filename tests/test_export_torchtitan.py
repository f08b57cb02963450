"""The torchtitan export read by torchtitan 0.3's own code (the ``frameworks`` extra).

The config module is loaded the way ``python -m torchtitan.train`` loads it
(``ConfigManager().parse_args(["--module", ..., "--config", ...])``), then torchtitan's own
``ParallelDims`` checks the degrees against the world size, the model config's
``update_from_config`` checks it against the parallelism, and its pipeline functions give the
stages each rank runs; the batch arithmetic is the trainer's (``trainer.py``: accumulation
steps = global / (local x dp degree), pipeline microbatches = local / microbatch size).

On a CPU-only torch, torchtitan's model packages import ``minimal_async_ep/kernels.py``, which
imports triton (not installed without CUDA); that one module, used only by MoE expert
parallelism at run time, is replaced by an empty module before torchtitan is imported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import types

import pytest
from export_matrix import CASES, Case, job_of

from autoplan.emit.torchtitan import export_torchtitan
from autoplan.runtime.config import TrainSettings
from simulator.cost.schedules import rank_chunks

pytest.importorskip("torchtitan")


def _triton_kernels_stub() -> types.ModuleType:
    """The kernels module's names resolve to a function that says it cannot run here."""
    stub = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")

    def unavailable(*args: object, **kwargs: object) -> None:
        raise RuntimeError("triton kernels are not available on a CPU-only torch")

    def attribute(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return unavailable

    stub.__getattr__ = attribute  # type: ignore[method-assign]
    return stub


if importlib.util.find_spec("triton") is None:
    sys.modules.setdefault("torchtitan.distributed.minimal_async_ep.kernels", _triton_kernels_stub())
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.distributed import pipeline_parallel  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402


def load(run_dir, module: str) -> object:
    sys.path.insert(0, str(run_dir))
    sys.modules.pop(module, None)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                return ConfigManager().parse_args(["--module", module, "--config", "autoplan_config"])
            except SystemExit:
                pytest.fail(f"torchtitan rejected the config: {err.getvalue()[-2000:]}")
    finally:
        sys.path.remove(str(run_dir))


@pytest.fixture(params=CASES, ids=lambda c: c.id)
def emitted(request, tmp_path, monkeypatch):
    case: Case = request.param
    job = job_of(case)
    export = export_torchtitan(job, TrainSettings())
    if export.refused:
        gpt_style = job.model.activation != "swiglu"
        experts_off_tensor_ranks = bool(job.model.num_experts) and job.plan.ep > 1 and job.plan.t > 1
        assert gpt_style or experts_off_tensor_ranks or (job.model.tie_embeddings and job.plan.p > 1)
        pytest.skip(export.refused)
    module = f"torchtitan_config_{request.param_index}"
    (tmp_path / f"{module}.py").write_text(export.files["torchtitan_config.py"])
    if job.plan.prec != "fp8":
        return job, export, load(tmp_path, module)
    pytest.importorskip("torchao")
    from torchtitan.components.quantization import float8

    # the converter checks for fp8 tensor cores (SM 8.9+) when the config is built on the training GPUs
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    return job, export, load(tmp_path, module)


def test_torchtitan_reads_the_plan(emitted):
    job, export, cfg = emitted
    plan, n = export.written, job.model.num_layers
    par, tr = cfg.parallelism, cfg.training
    dims = ParallelDims.from_config(par, plan.gpus)  # raises unless the degrees multiply to the world
    assert (dims.tp, dims.pp, dims.cp, dims.ep) == (plan.t, plan.p, plan.cp, plan.ep)
    assert dims.dp_replicate * dims.dp_shard == plan.d  # the batch is split d ways (cp splits sequences)
    if plan.zero >= 2:  # torchtitan's FSDP mesh is dp_shard x cp
        assert (dims.dp_replicate, dims.dp_shard * dims.cp) == (plan.replicas, plan.shard_group)
        assert par.fsdp_reshard_after_forward == ("always" if plan.zero == 3 else "never")
    else:
        assert dims.dp_shard == 1 and dims.cp == 1  # with cp > 1 torchtitan always shards (emit changes zero)
    assert par.enable_sequence_parallel == bool(plan.sp)
    batch_degree = dims.dp_replicate * dims.dp_shard if dims.dp_enabled else 1
    assert tr.global_batch_size == job.global_batch
    accumulation = tr.global_batch_size // (tr.local_batch_size * batch_degree)
    microbatches = tr.local_batch_size // par.pipeline_parallel_microbatch_size if plan.p > 1 else 1
    assert accumulation * microbatches == job.m
    assert (tr.local_batch_size if plan.p == 1 else par.pipeline_parallel_microbatch_size) == plan.mb
    assert tr.enable_cpu_offload == (plan.offload == "cpu")
    ac = cfg.activation_checkpoint
    mode = "none" if ac is None else type(ac).__qualname__.split(".")[0]
    assert mode == {"none": "none", "full": "FullAC", "selective": "SelectiveAC"}[plan.ckpt]
    model = cfg.model_spec.model
    assert len(model.layers) == n and model.dim == job.model.hidden_size
    if job.model.num_experts:  # torchtitan's MoE layer: E experts of the expert FFN size, Mixtral's top-k routing
        moe = model.layers[0].moe
        assert model.layers[0].feed_forward is None and moe.num_experts == job.model.num_experts
        assert moe.routed_experts.inner_experts.hidden_dim == job.model.ffn
        assert (moe.router.top_k, moe.router.score_func, moe.router.route_norm) == (
            job.model.moe_router_topk,
            "softmax",
            True,
        )
        assert moe.load_balance_coeff is None
        # Qwen3Model.Config.get_nparams_and_flops (models/qwen3/model.py) asserts the attention's head_dim is set
        assert all(layer.attention.head_dim == job.model.head_dim for layer in model.layers)
        if plan.ep > 1:  # the expert ranks are data-shard ranks, each holding E/ep whole experts
            assert plan.t == 1 and dims.dp_shard * dims.cp % plan.ep == 0
    else:
        assert model.layers[0].feed_forward.w1.out_features == job.model.ffn
    assert model.layers[0].attention.rope.theta == job.model.rope_theta
    model.update_from_config(config=cfg)  # torchtitan's own model-vs-parallelism checks
    from torchtitan.components.quantization.float8 import Float8Linear

    float8 = not job.model.num_experts and isinstance(model.layers[0].feed_forward.w1, Float8Linear.Config)
    assert float8 == (plan.prec == "fp8") == cfg.compile.enable  # fp8: the layers' linears, compiled
    assert not isinstance(model.lm_head, Float8Linear.Config)  # the output layer stays bf16


def test_torchtitan_pipeline_stages_are_the_plans(emitted):
    job, export, cfg = emitted
    plan = export.written
    if plan.p == 1:
        pytest.skip("no pipeline")
    par = cfg.parallelism
    stages, layers, _, _ = pipeline_parallel._get_pipeline_metadata(
        types.SimpleNamespace(pp=plan.p), par, cfg.model_spec.model
    )
    parts = par.module_fqns_per_model_part
    assert [sum(x.startswith("layers.") for x in part) for part in parts] == list(
        plan.chunk_layers(job.model.num_layers)
    )
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    for rank in range(plan.p):
        mine = pipeline_parallel._get_pp_rank_to_stage_indices_mapping(
            rank, plan.p, par.pipeline_parallel_schedule, len(parts)
        )
        assert list(mine) == rank_chunks(plan.schedule, plan.p, plan.v)[rank]  # looped, or ZB-V's V
    assert layers == job.model.num_layers
    del stages


def test_torchtitan_trainer_counts_the_experts_model(emitted):
    """What ``Trainer.__init__`` (torchtitan/trainer.py) does with a mixture-of-experts model before
    training: ``update_from_config``, the model built on the meta device in the training dtype,
    then ``model_config.get_nparams_and_flops(model, seq_len)``, which for torchtitan's Qwen3
    decoder (models/qwen3/model.py) asserts ``layers[0].attention.head_dim is not None``; it
    counts as many parameters as autoplan (simulator.cost.params.total_params)."""
    import torch
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools import utils

    from simulator.cost.params import total_params

    job, _, cfg = emitted
    if not job.model.num_experts:
        pytest.skip("dense: torchtitan's Llama3 decoder counts with dim // n_heads")
    model_config = cfg.model_spec.model
    model_config.update_from_config(config=cfg)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[cfg.training.dtype]):
        model = model_config.build()
    params, flops_per_token = model_config.get_nparams_and_flops(model, cfg.training.seq_len)
    assert params == total_params(job.model) and flops_per_token > 0


@pytest.mark.parametrize("experts", [0, 4])
def test_torchtitan_model_has_the_parameters_autoplan_prices(tmp_path, experts):
    """The emitted model, built by torchtitan on the meta device, holds as many parameters as
    autoplan counts for the model file (simulator.cost.params.total_params): a small Llama-style
    decoder, dense and with 4 experts (top 2)."""
    import torch

    from hwprofiles.load import load_cluster
    from simulator.cost.params import total_params
    from simulator.job import Job
    from simulator.plan import parse_plan
    from simulator.specs import ModelSpec

    model = ModelSpec(
        name="small",
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=96,
        vocab_size=256,
        seq_length=64,
        activation="swiglu",
        tie_embeddings=False,
        position_embedding_type="rope",
        normalization="RMSNorm",
        num_experts=experts or None,
    )
    cluster = load_cluster("dgx-h100", 1)
    plan, _ = parse_plan("t=1,p=1,mb=1,zero=3" + (",ep=2" if experts else ""), model, cluster.num_gpus, 8)
    export = export_torchtitan(Job(model, cluster, plan, 8), TrainSettings())
    assert not export.refused
    (tmp_path / f"small_{experts}.py").write_text(export.files["torchtitan_config.py"])
    cfg = load(tmp_path, f"small_{experts}")
    with torch.device("meta"):
        built = cfg.model_spec.model.build()
    assert sum(p.numel() for p in built.parameters()) == total_params(model)
