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
from typing import Any

import pytest
from export_matrix import CASES, Case, job_of, small_llama

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
    _runs_what_the_profile_prices(cfg)


def _runs_what_the_profile_prices(cfg: Any) -> None:
    """Flag by flag, the config runs what autoplan/frameworks/profiles/torchtitan.yaml prices:
    fp32 gradient reduction, FSDP2's ZeRO-2 as reshard-after-forward "never", the chunked loss with
    its chunk count."""
    from torchtitan.components.loss import ChunkedLossWrapper

    from autoplan.frameworks import load_framework
    from simulator.cost.memory import LOSS_CHUNKS

    runtime = load_framework("torchtitan").base_runtime()
    assert cfg.training.mixed_precision_reduce == "float32" and runtime.sharded_reduce_bytes == 4
    assert runtime.zero2 == "fsdp2" and runtime.zero3 == "fsdp2"
    assert isinstance(cfg.loss, ChunkedLossWrapper.Config) and cfg.loss.num_chunks == LOSS_CHUNKS
    assert runtime.cross_entropy == "chunked"


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
        schedule = pipeline_parallel._build_pipeline_schedule(  # as each pipeline rank builds it
            parallelism=par,
            local_batch_size=cfg.training.local_batch_size,
            stages=[_stub_stage(s, len(parts), plan.p, rank) for s in mine],
            loss_fn=lambda *a: a,
        )
        assert schedule._n_microbatches == job.m  # every microbatch of the step in one schedule
    assert layers == job.model.num_layers
    del stages


def _stub_stage(index: int, stages: int, ranks: int, rank: int) -> types.SimpleNamespace:
    """What torchtitan's ``_build_pipeline_schedule`` reads of a ``PipelineStage``."""
    from torch import nn

    return types.SimpleNamespace(
        submod=nn.Linear(1, 1),
        stage_index=index,
        num_stages=stages,
        group_size=ranks,
        group_rank=rank,
        is_first=index == 0,
        is_last=index == stages - 1,
    )


def test_torchtitan_builds_its_device_mesh(emitted):
    """torchtitan's ``ParallelDims.build_mesh`` on every rank's world, over torch's fake process
    group (no devices): the mesh's dimensions are the plan's."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _, export, cfg = emitted
    plan = export.written
    dims = ParallelDims.from_config(cfg.parallelism, plan.gpus)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.gpus)
    try:
        assert dims.build_mesh().size() == plan.gpus  # build_mesh checks every axis' size itself, too
        for axis, want in (("tp", plan.t), ("pp", plan.p), ("cp", plan.cp)):
            mesh = dims.get_optional_mesh(axis)
            assert (1 if mesh is None else mesh.size()) == want
    finally:
        dist.destroy_process_group()


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

    model = small_llama(2, experts or None)
    cluster = load_cluster("dgx-h100", 1)
    plan, _ = parse_plan("t=1,p=1,mb=1,zero=3" + (",ep=2" if experts else ""), model, cluster.num_gpus, 8)
    export = export_torchtitan(Job(model, cluster, plan, 8), TrainSettings())
    assert not export.refused
    (tmp_path / f"small_{experts}.py").write_text(export.files["torchtitan_config.py"])
    cfg = load(tmp_path, f"small_{experts}")
    with torch.device("meta"):
        built = cfg.model_spec.model.build()
    assert sum(p.numel() for p in built.parameters()) == total_params(model)


ZBH1 = next(c for c in CASES if "schedule=zbh1" in c.plan)


def _zbh1_export(tmp_path):
    """The matrix's ZB-H1 case as torchtitan reads it: the export, the plan it runs and the config."""
    job = job_of(ZBH1)
    export = export_torchtitan(job, TrainSettings())
    assert not export.refused and export.written is not None
    (tmp_path / "torchtitan_config_zbh1.py").write_text(export.files["torchtitan_config.py"])
    return job, export, load(tmp_path, "torchtitan_config_zbh1")


def test_torchtitan_builds_zbh1_with_one_stage_per_rank(tmp_path):
    """schedule=zbh1 runs as written: torchtitan's ``_build_pipeline_schedule``
    (distributed/pipeline_parallel.py) builds torch's ``ScheduleInterleavedZeroBubble`` over each
    rank's one stage (``_get_pp_rank_to_stage_indices_mapping`` over the p parts), and the order it
    computes is ZB-H1's: every microbatch's backward split into input (I) and weight (W) passes,
    rank r running r + 1 input passes before its first weight pass (the later the stage, the
    longer its weight passes wait to fill the bubble). Only ZeRO-1 changes (FSDP2 replicate)."""
    from collections import Counter

    from torch import nn
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    job, export, cfg = _zbh1_export(tmp_path)
    plan, par = export.written, cfg.parallelism
    assert plan.schedule == "zbh1" and plan.v == 1 and [c.key for c in export.changes] == ["zero"]
    assert par.pipeline_parallel_schedule == "InterleavedZeroBubble"
    parts = par.module_fqns_per_model_part
    assert len(parts) == plan.p and par.pipeline_parallel_layers_per_stage is None
    for rank in range(plan.p):
        mine = pipeline_parallel._get_pp_rank_to_stage_indices_mapping(
            rank, plan.p, par.pipeline_parallel_schedule, len(parts)
        )
        assert mine == (rank,)
        stages = [
            types.SimpleNamespace(
                submod=nn.Linear(1, 1),
                stage_index=s,
                num_stages=len(parts),
                group_size=plan.p,
                group_rank=rank,
                is_first=s == 0,
                is_last=s == len(parts) - 1,
            )
            for s in mine
        ]
        schedule = pipeline_parallel._build_pipeline_schedule(
            parallelism=par, local_batch_size=cfg.training.local_batch_size, stages=stages, loss_fn=lambda *a: a
        )
        assert isinstance(schedule, ScheduleInterleavedZeroBubble) and schedule.n_local_stages == 1
        assert schedule._n_microbatches == job.m
        ops = [a.computation_type.value for a in schedule.pipeline_order[rank] if a is not None]
        assert Counter(ops) == {"F": job.m, "I": job.m, "W": job.m}
        assert ops[: ops.index("W")].count("I") == rank + 1


def test_torchtitan_zbh1_rounds_that_do_not_divide_run_1f1b(tmp_path):
    """With m microbatches that its rounds (m // p) do not divide, the export writes 1F1B:
    torch's ``ScheduleInterleavedZeroBubble.__init__``, built by torchtitan's
    ``_build_pipeline_schedule`` from the emitted config with the schedule set back to ZB-H1,
    raises "Zero bubble requires the number of microbatches to be a multiple of the number of rounds"."""
    import dataclasses

    from torch import nn

    case = next(c for c in CASES if "schedule=zbh1" in c.plan and job_of(c).m % max(1, job_of(c).m // job_of(c).plan.p))
    job = job_of(case)
    export = export_torchtitan(job, TrainSettings())
    assert export.written is not None and export.written.schedule == "1f1b"
    assert any(c.key == "schedule" and "multiple of the number of rounds" in c.why for c in export.changes)
    (tmp_path / "torchtitan_config_rounds.py").write_text(export.files["torchtitan_config.py"])
    cfg = load(tmp_path, "torchtitan_config_rounds")
    par = dataclasses.replace(cfg.parallelism, pipeline_parallel_schedule="InterleavedZeroBubble")
    stage = types.SimpleNamespace(
        submod=nn.Linear(1, 1), stage_index=0, num_stages=job.plan.p, group_size=job.plan.p, group_rank=0
    )
    with pytest.raises(ValueError, match="multiple of the number of rounds"):
        pipeline_parallel._build_pipeline_schedule(
            parallelism=par, local_batch_size=cfg.training.local_batch_size, stages=[stage], loss_fn=lambda *a: a
        )


def _zbh1_rank(rank: int, world: int, init: str, par: object, local_batch: int) -> None:
    """One pipeline rank of a real ZB-H1 step on gloo: torchtitan's schedule builder over one
    ``PipelineStage`` (a small block); the gradients must be those of the unsplit model."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    def blocks() -> list[torch.nn.Module]:
        torch.manual_seed(0)
        return [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(world)]

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.nn.functional.mse_loss(out, target, reduction="sum"), None

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        mine = blocks()[rank]
        stage = PipelineStage(mine, rank, world, torch.device("cpu"))
        schedule = pipeline_parallel._build_pipeline_schedule(
            parallelism=par, local_batch_size=local_batch, stages=[stage], loss_fn=loss_fn
        )
        torch.manual_seed(1)
        x, target = torch.randn(local_batch, 8), torch.randn(local_batch, 8)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=target)
        else:
            schedule.step()
        whole = torch.nn.Sequential(*blocks())
        loss_fn(whole(x), target)[0].backward()
        for got, want in zip(mine.parameters(), whole[rank].parameters(), strict=True):
            torch.testing.assert_close(got.grad, want.grad, atol=1e-5, rtol=1e-4)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_torchtitan_zbh1_step_runs_with_one_stage_per_rank(tmp_path):
    """The emitted ZB-H1 pipeline takes a training step: p gloo processes on CPU, each building
    its schedule with torchtitan's ``_build_pipeline_schedule`` from the emitted parallelism
    config and local batch (torch's ``ScheduleInterleavedZeroBubble``, one ``PipelineStage`` per
    rank, the plan's m microbatches), give the gradients of the unsplit model."""
    import torch.multiprocessing as mp

    _, export, cfg = _zbh1_export(tmp_path)
    assert export.written is not None and export.written.schedule == "zbh1"
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(
        _zbh1_rank,
        args=(export.written.p, init, cfg.parallelism, cfg.training.local_batch_size),
        nprocs=export.written.p,
    )


def test_the_launcher_starts_a_real_job_or_a_smoke_test_and_torchtitan_reads_it(tmp_path, monkeypatch):
    """torchtitan_launch.sh as a node runs it (tests/launchers.py): without a tokenizer or a dataset
    it stops with one line; with DATASET, DATASET_PATH and TOKENIZER (or MOCK_DATA=1: torchtitan's
    c4_test sample) torchtitan's own ConfigManager reads the arguments it passes into the job: the
    data, the tokenizer, the output folder under the run dir, the schedule's steps, checkpoints
    saved and resumed every SAVE_INTERVAL steps (optimizer included), TensorBoard, and the
    learning rate's warm-up and cosine decay to its final share."""
    import launchers

    from autoplan.emit.schedule import training_schedule
    from hwprofiles.load import load_cluster
    from simulator.job import Job
    from simulator.plan import parse_plan

    model, cluster = small_llama(4), load_cluster("localhost-cpu", 1)
    job = Job(model, cluster, parse_plan("t=1,p=1,zero=3", model, cluster.num_gpus, 8)[0], 8)
    files = export_torchtitan(job, TrainSettings()).files
    run = lambda **env: launchers.launched_argv(files, "torchtitan_launch.sh", tmp_path, "torchtitan.train", **env)
    code, argv, err = run()
    assert code != 0 and not argv and "TOKENIZER" in err
    code, argv, err = run(TOKENIZER="/tok")
    assert code != 0 and not argv and "DATASET" in err and "MOCK_DATA=1" in err
    code, argv, err = run(TOKENIZER="/tok", DATASET="c4", DATASET_PATH="/data/c4", SAVE_INTERVAL="250")
    assert code == 0, err
    monkeypatch.syspath_prepend(str(tmp_path / "run"))
    sys.modules.pop("torchtitan_config", None)
    with contextlib.redirect_stderr(io.StringIO()):
        cfg: Any = ConfigManager().parse_args(argv)
    schedule = training_schedule(model, job.global_batch, TrainSettings())
    assert (cfg.dataloader.dataset, cfg.dataloader.dataset_path, cfg.hf_assets_path) == ("c4", "/data/c4", "/tok")
    assert cfg.dump_folder == str(tmp_path / "run" / "outputs") and cfg.training.steps == schedule.train_iters
    assert cfg.checkpoint.enable and cfg.checkpoint.interval == 250 and not cfg.checkpoint.last_save_model_only
    assert cfg.metrics.enable_tensorboard
    lr = cfg.lr_scheduler
    assert (lr.warmup_steps, lr.total_steps, lr.decay_type) == (schedule.warmup_iters, schedule.decay_iters, "cosine")
    assert lr.min_lr_factor == pytest.approx(schedule.min_lr_share)
    code, argv, err = run(TOKENIZER="/tok", MOCK_DATA="1", TRAIN_ITERS="20")
    assert code == 0 and argv[argv.index("--dataloader.dataset") + 1] == "c4_test"
    assert argv[argv.index("--training.steps") + 1] == "20"
