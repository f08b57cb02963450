"""The DeepSpeed export read by DeepSpeed's own code (the ``frameworks`` extra: deepspeed 0.19.8).

``DeepSpeedConfig`` loads ds_config.json with the mpu that deepspeed_setup.py gives
``deepspeed.initialize`` (a pipeline brings its own grid), and the emitted
``pipeline_module`` builds a real ``PipelineModule`` for every pipeline stage; both run in one
process with ``deepspeed.comm`` answering as a rank of the plan's world (no backend is started:
DeepSpeedConfig asks only ranks and world sizes, PipelineModule also makes groups it does not
use while being built). What DeepSpeed read is compared with the plan the export says it runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from export_matrix import CASES, Case, job_of, small_llama
from torch import nn

from autoplan.emit.deepspeed import export_deepspeed
from autoplan.runtime.config import TrainSettings
from simulator.cost.schedules import rank_chunks
from simulator.plan import num_microbatches

deepspeed = pytest.importorskip("deepspeed")
from deepspeed import comm as ds_comm  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402


class _Group:
    def __init__(self, ranks: Any) -> None:
        self.ranks = list(ranks)


@contextlib.contextmanager
def as_rank(world: int, rank: int = 0):
    """deepspeed.comm answers as ``rank`` of ``world`` (no process group is created)."""
    fake = {
        "get_rank": lambda group=None: rank if group is None else group.ranks.index(rank),
        "get_world_size": lambda group=None: world if group is None else len(group.ranks),
        "new_group": lambda ranks=None, **kw: _Group(range(world) if ranks is None else ranks),
        "broadcast": lambda *a, **kw: None,
        "all_reduce": lambda *a, **kw: None,
        "barrier": lambda *a, **kw: None,
    }
    saved = {k: getattr(ds_comm, k) for k in fake}
    os.environ.setdefault("LOCAL_RANK", "0")
    try:
        for k, v in fake.items():
            setattr(ds_comm, k, v)
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for k, v in saved.items():
            setattr(ds_comm, k, v)


def load_setup(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"deepspeed_setup_{abs(hash(path))}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Block(nn.Module):
    """A transformer block's stand-in that counts its forward runs (recomputation runs it again)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return self.fc(x)


def toy_layers(n: int) -> list[nn.Module]:
    """The shape of a GPT as a pipeline layer list: embedding, n blocks, norm, head."""
    return [nn.Linear(4, 4), *(Block() for _ in range(n)), nn.LayerNorm(4), nn.Linear(4, 4)]


@pytest.fixture(params=CASES, ids=lambda c: c.id)
def emitted(request, tmp_path):
    case: Case = request.param
    job = job_of(case)
    export = export_deepspeed(job, TrainSettings())
    if export.refused:  # experts AutoEP cannot run: with t > 1, or split ep ways over a pipeline
        assert job.model.num_experts and (job.plan.t > 1 or (job.plan.p > 1 and job.plan.ep > 1))
        assert "auto_ep" in export.refused
        pytest.skip(export.refused)
    assert export.refused is None and export.written is not None
    for name, text in export.files.items():
        (tmp_path / name).write_text(text)
    return job, export, tmp_path


def test_deepspeed_config_reads_the_plan(emitted):
    job, export, out = emitted
    plan = export.written
    setup = load_setup(out / "deepspeed_setup.py")
    cfg_dict = json.loads((out / "ds_config.json").read_text())
    if plan.p > 1:  # deepspeed.initialize takes the grid of the PipelineModule as its mpu
        with as_rank(plan.gpus):
            mpu = setup.pipeline_module(toy_layers(job.model.num_layers), Block).mpu()
    elif plan.t > 1:
        mpu = setup.DataParallelSize()
    else:
        mpu = None
    with as_rank(plan.gpus):
        cfg = DeepSpeedConfig(cfg_dict, mpu=mpu)
    assert cfg.world_size == plan.d
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu) == (job.global_batch, plan.mb)
    assert cfg.gradient_accumulation_steps == num_microbatches(plan, job.global_batch)  # of the plan it runs
    assert cfg.zero_optimization_stage == plan.zero
    if plan.p > 1:  # PipelineEngine: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        assert cfg.zero_optimization_stage < 2
    zc = cfg.zero_config
    assert (zc.offload_optimizer.device if zc.offload_optimizer else "none") == plan.offload
    expected_param = plan.offload if plan.zero == 3 else "none"
    assert (zc.offload_param.device if zc.offload_param else "none") == expected_param
    assert cfg.bfloat16_config.enabled and cfg.gradient_clipping == TrainSettings().max_norm
    assert cfg.tensor_parallel_config.autotp_size == (plan.t if plan.p == 1 and plan.t > 1 else 0)
    assert cfg.optimizer_params["lr"] == TrainSettings().lr


def test_pipeline_module_has_the_plans_stages_and_recomputation(emitted):
    job, export, out = emitted
    plan = export.written
    if plan.p == 1:
        pytest.skip("no pipeline")
    setup = load_setup(out / "deepspeed_setup.py")
    n = job.model.num_layers
    sizes = plan.chunk_layers(n)
    full = [f for f, _ in plan.chunk_recompute(n)]
    for stage in range(plan.p):
        rank = stage * plan.d * plan.t  # the first rank of the stage (pipe-major topology)
        with as_rank(plan.gpus, rank):
            module = setup.pipeline_module(toy_layers(n), Block)
            module._precompute_checkpointable_values()
        assert module.stage_id == stage
        # the rank's chunks: its stage, or under zbv DualPipeVModule's two phases (stages r and 2p-1-r)
        for phase, chunk in enumerate(rank_chunks(plan.schedule, plan.p, plan.v)[stage]):
            if plan.v > 1:
                module.activate_phase(phase)
            blocks = [f for f in module.forward_funcs if isinstance(f, Block)]
            assert len(blocks) == sizes[chunk]
            interval = module.activation_checkpoint_interval
            recomputed = [
                f
                for start, ok in zip(
                    range(0, len(module.forward_funcs), max(interval, 1)), module.is_checkpointable_results
                )
                if ok
                for f in module.forward_funcs[start : start + interval]
            ]
            assert recomputed == blocks[: full[chunk]]
            _forward_and_backward(module, blocks, full[chunk])
        assert module.mpu().get_data_parallel_world_size() == plan.d


def _forward_and_backward(module: nn.Module, blocks: list[Block], recomputed: int) -> None:
    """One forward and backward of a stage (its phase, under DualPipeV) as the engine runs it: every
    block runs forward, the recomputed ones once more in backward, and every parameter gets a gradient."""
    for b in blocks:
        b.runs = 0
    x = torch.randn(2, 4, requires_grad=True)
    module(x).sum().backward()
    assert [b.runs for b in blocks] == [2] * recomputed + [1] * (len(blocks) - recomputed)
    assert all(b.fc.weight.grad is not None and torch.isfinite(b.fc.weight.grad).all() for b in blocks)


def test_recompute_blocks_without_a_pipeline(emitted):
    """recompute_blocks checkpoints the planned first blocks: their forward runs again in backward."""
    job, export, out = emitted
    plan = export.written
    if plan.p > 1:
        pytest.skip("the pipeline module recomputes")
    setup = load_setup(out / "deepspeed_setup.py")
    n = job.model.num_layers
    blocks = [Block() for _ in range(n)]
    setup.recompute_blocks(blocks)
    x = torch.randn(2, 4, requires_grad=True)
    for b in blocks:
        x = b(x)
    x.sum().backward()
    full = plan.chunk_recompute(n)[0][0]
    assert [b.runs for b in blocks] == [2] * full + [1] * (n - full)


ZBV = next(c for c in CASES if "schedule=zbv" in c.plan and not job_of(c).model.num_experts)


def test_zbv_runs_as_dualpipev(tmp_path):
    """schedule=zbv is written for DeepSpeed's DualPipeV (deepspeed/runtime/pipe/dualpipev.py):
    ``pipeline_module`` builds a ``DualPipeVModule``, so ``deepspeed.initialize`` picks
    ``DualPipeVEngine`` (``engine_cls = DualPipeVEngine if isinstance(model, DualPipeVModule)``,
    deepspeed/__init__.py), every rank r holding the plan's stages r and 2p-1-r; what that engine's
    ``__init__`` asserts holds for what ``DeepSpeedConfig`` reads (gradient_accumulation_steps >=
    2 x stages, no pipe_partitioned / grad_partitioned under model parallelism); and its
    ``DualPipeVSchedule`` runs every microbatch forward and backward through both of the rank's
    stages. The export changes nothing and notes that the weight gradients are not deferred."""
    from deepspeed.pipe import DualPipeVModule
    from deepspeed.runtime.pipe import schedule as ds_schedule

    job = job_of(ZBV)
    export = export_deepspeed(job, TrainSettings())
    assert export.refused is None and export.exact and export.written == job.plan
    assert any("DualPipeVSchedule keeps the weight gradients inside BackwardPass" in n for n in export.notes)
    for name, text in export.files.items():
        (tmp_path / name).write_text(text)
    plan, n = export.written, job.model.num_layers
    setup = load_setup(tmp_path / "deepspeed_setup.py")
    sizes = plan.chunk_layers(n)
    for stage in range(plan.p):
        with as_rank(plan.gpus, stage * plan.d * plan.t):
            module = setup.pipeline_module(toy_layers(n), Block)
        assert isinstance(module, DualPipeVModule) and module.num_stages == 2 * plan.p
        for phase, chunk in enumerate((stage, 2 * plan.p - 1 - stage)):
            module.activate_phase(phase)
            assert sum(isinstance(f, Block) for f in module.forward_funcs) == sizes[chunk]
        with as_rank(plan.gpus, stage * plan.d * plan.t):
            cfg = DeepSpeedConfig(json.loads((tmp_path / "ds_config.json").read_text()), mpu=module.mpu())
        micro_batches = cfg.gradient_accumulation_steps
        assert micro_batches == job.m >= 2 * plan.p  # DualPipeVEngine: "DualPipeV needs gradient_accumulation_steps"
        assert (module.mpu().model_parallel_size > 1) == (plan.t > 1)  # PipelineEngine's is_model_parallel
        assert not (cfg.pipeline["pipe_partitioned"] or cfg.pipeline["grad_partitioned"])
        steps = [c for step in ds_schedule.DualPipeVSchedule(micro_batches, plan.p, stage).steps() for c in step]
        for phase in (0, 1):
            forward = [c for c in steps if isinstance(c, ds_schedule.ForwardPass) and c.kwargs["phase"] == phase]
            backward = [c for c in steps if isinstance(c, ds_schedule.BackwardPass) and c.kwargs["phase"] == phase]
            assert len(forward) == len(backward) == micro_batches


EXPERTS = [c for c in CASES if job_of(c).model.num_experts and "t=1,p=1," in c.plan]


@pytest.mark.parametrize("case", EXPERTS, ids=lambda c: c.id)
def test_experts_run_with_autoep(case):
    """A mixture of experts with t = 1 and p = 1 is written for DeepSpeed (no longer refused): with
    ep > 1 ds_config.json enables AutoEP, and what ``DeepSpeedEngine._configure_expert_parallel``
    (runtime/engine.py) does with it before it touches the model runs here on what
    ``DeepSpeedConfig`` read: ``validate_autoep_config``, ``build_folding_spec`` and
    ``validate_folding_global`` (module_inject/auto_ep_config.py, auto_ep_folding.py) accept it,
    and ``groups._create_expert_and_data_parallel`` (utils/groups.py) makes expert groups of ep
    ranks, every rank of the plan's world in one, each holding E / ep experts."""
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config
    from deepspeed.module_inject.auto_ep_folding import build_folding_spec, validate_folding_global
    from deepspeed.utils import groups

    job = job_of(case)
    export = export_deepspeed(job, TrainSettings())
    assert export.refused is None and export.exact and export.written == job.plan
    plan, m = export.written, job.model
    with as_rank(plan.gpus):
        cfg = DeepSpeedConfig(json.loads(export.files["ds_config.json"]))
    ep_cfg = cfg.expert_parallel_config
    assert ep_cfg.enabled == (plan.ep > 1)
    if plan.ep == 1:
        return  # every rank holds every expert: the model's own MoE layers, data parallel
    assert (ep_cfg.autoep_size, ep_cfg.top_k, ep_cfg.score_func, ep_cfg.route_norm) == (
        plan.ep,
        m.moe_router_topk,
        "softmax",
        True,
    )
    tp = max(cfg.tensor_parallel_config.autotp_size, 1)
    validate_autoep_config(ep_cfg, plan.gpus, 1, tp, 1)
    spec = build_folding_spec(world_size=plan.gpus, pp_size=1, tp_size=tp, ep_size=plan.ep, etp_size=1, mp_mode="sp")
    validate_folding_global(spec, zero_stage=cfg.zero_optimization_stage, autoep_enabled=True)
    saved = (dict(groups._EXPERT_PARALLEL_GROUP), dict(groups._EXPERT_DATA_PARALLEL_GROUP))
    try:
        with as_rank(plan.gpus), pytest.MonkeyPatch.context() as mp:
            mp.setattr(ds_comm, "is_initialized", lambda: True)
            groups._create_expert_and_data_parallel(ep_cfg.autoep_size, mp_size=1, pp_size=1)
            ep_group = groups._get_expert_parallel_group(f"ep_size_{plan.ep}")
            edp_group = groups._get_expert_data_parallel_group(f"ep_size_{plan.ep}")
        assert len(ep_group.ranks) == plan.ep and len(edp_group.ranks) == plan.gpus // plan.ep
        assert m.num_experts % plan.ep == 0  # AutoEP: E / ep whole experts per rank
    finally:
        groups._EXPERT_PARALLEL_GROUP.clear()
        groups._EXPERT_PARALLEL_GROUP.update(saved[0])
        groups._EXPERT_DATA_PARALLEL_GROUP.clear()
        groups._EXPERT_DATA_PARALLEL_GROUP.update(saved[1])


def _dualpipev_rank(rank: int, world: int, out: str, port: int) -> None:
    """One rank of a DualPipeV training step from the emitted files (deepspeed_setup.py's
    ``pipeline_module`` and ``initialize``, ds_config.json) on gloo."""
    import math

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from deepspeed.runtime.pipe.dualpipev import DualPipeVEngine
    from deepspeed_cpu import without_shm_comm

    without_shm_comm()
    deepspeed.init_distributed(dist_backend="gloo")
    setup = load_setup(Path(out) / "deepspeed_setup.py")
    torch.manual_seed(0)
    layers = [nn.Linear(4, 4), *(Block() for _ in range(sum(setup.STAGE_LAYERS))), nn.LayerNorm(4), nn.Linear(4, 4)]
    model = setup.pipeline_module(layers, Block, loss_fn=nn.functional.mse_loss)
    engine, *_ = setup.initialize(model)
    assert isinstance(engine, DualPipeVEngine)
    data = iter([(torch.randn(1, 4), torch.randn(1, 4)) for _ in range(engine.micro_batches)])
    assert math.isfinite(float(engine.train_batch(data_iter=data)))


@pytest.mark.slow
def test_zbv_dualpipev_takes_a_training_step(tmp_path):
    """The emitted files start DeepSpeed's DualPipeVEngine and run a step: a small Llama-style
    model's zbv plan (t=1, p=2, m=4 = 2p microbatches) on the 4 ranks of ``localhost-cpu``, four
    gloo processes, each calling the emitted ``pipeline_module`` and ``initialize``. On CPU the
    config's bf16 and its fused AdamW (a CUDA kernel) are swapped for fp32 and torch's Adam."""
    import socket

    import torch.multiprocessing as mp

    from hwprofiles.load import load_cluster
    from simulator.job import Job
    from simulator.plan import parse_plan

    model = small_llama(4)
    cluster = load_cluster("localhost-cpu", 1)
    plan, _ = parse_plan("t=1,p=2,mb=1,zero=1,schedule=zbv", model, cluster.num_gpus, 8)
    export = export_deepspeed(Job(model, cluster, plan, 8), TrainSettings())
    assert export.exact and export.written is not None and export.written.schedule == "zbv"
    for name, text in export.files.items():
        (tmp_path / name).write_text(text)
    cfg = json.loads((tmp_path / "ds_config.json").read_text())
    del cfg["bf16"]
    cfg["optimizer"] = {"type": "Adam", "params": {**cfg["optimizer"]["params"], "torch_adam": True}}
    cfg["csv_monitor"]["output_path"] = str(tmp_path / "logs")  # not the working directory's
    (tmp_path / "ds_config.json").write_text(json.dumps(cfg))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_dualpipev_rank, args=(cluster.num_gpus, str(tmp_path), port), nprocs=cluster.num_gpus)


def test_the_config_schedules_the_learning_rate_and_logs():
    """ds_config.json's WarmupCosineLR, built by DeepSpeed from the config's own parameters over a
    torch optimizer at the peak rate, rises linearly to the peak over the warm-up and ends at the
    schedule's final rate; the CSV monitor logs each step."""
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    from autoplan.emit.schedule import training_schedule

    job = _small_job()  # no published recipe: 10,000 iterations, 100 of warm-up
    cfg = json.loads(export_deepspeed(job, TrainSettings()).files["ds_config.json"])
    schedule = training_schedule(job.model, job.global_batch, TrainSettings())
    assert cfg["scheduler"]["type"] == "WarmupCosineLR" and cfg["csv_monitor"]["enabled"]
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=schedule.lr)
    sched = WarmupCosineLR(opt, **cfg["scheduler"]["params"])
    lrs = []
    for _ in range(schedule.decay_iters + 2):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    half = schedule.warmup_iters // 2  # DeepSpeed's step k sets the rate of iteration k - 1
    assert lrs[half + 1] == pytest.approx(schedule.lr * half / schedule.warmup_iters)
    assert max(lrs) == pytest.approx(schedule.lr)
    assert lrs[-1] == pytest.approx(schedule.min_lr)


def _small_job() -> Any:
    """A small Llama-style model's plain data-parallel job on the localhost-cpu node."""
    from hwprofiles.load import load_cluster
    from simulator.job import Job
    from simulator.plan import parse_plan

    model, cluster = small_llama(4), load_cluster("localhost-cpu", 1)
    return Job(model, cluster, parse_plan("t=1,p=1,zero=1", model, cluster.num_gpus, 8)[0], 8)


def test_resume_and_save_checkpoints_where_the_setup_says(tmp_path, monkeypatch):
    """deepspeed_setup.py's checkpoint helpers: a fresh start resumes at step 0; a save every
    SAVE_INTERVAL steps and at the last goes to CHECKPOINT_DIR with the step, which resume reads back."""
    for name, text in export_deepspeed(_small_job(), TrainSettings()).files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("SAVE_INTERVAL", "2")
    monkeypatch.setenv("TRAIN_ITERS", "5")
    setup = load_setup(tmp_path / "deepspeed_setup.py")

    class Engine:  # what the helpers call on a DeepSpeedEngine
        def save_checkpoint(self, save_dir: str, tag: str, client_state: dict) -> None:
            Path(save_dir).mkdir(parents=True, exist_ok=True)
            (Path(save_dir) / "latest").write_text(tag)
            self.saved = client_state

        def load_checkpoint(self, load_dir: str) -> tuple[str, dict]:
            return load_dir, self.saved

    engine = Engine()
    assert setup.STEPS == 5 and setup.resume(engine) == 0
    assert [setup.save_if_due(engine, step) for step in range(1, 6)] == [False, True, False, True, True]
    assert setup.resume(engine) == 5
