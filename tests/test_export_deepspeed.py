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
from export_matrix import CASES, Case, job_of
from torch import nn

from autoplan.emit.deepspeed import export_deepspeed
from autoplan.runtime.config import TrainSettings
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
    if job.model.num_experts:  # DeepSpeed-MoE runs the model's own MoE layers
        assert export.refused and "mixture of experts" in export.refused
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
        blocks = [f for f in module.forward_funcs if isinstance(f, Block)]
        assert len(blocks) == sizes[stage]
        interval = module.activation_checkpoint_interval
        recomputed = [
            f
            for start, ok in zip(
                range(0, len(module.forward_funcs), max(interval, 1)), module.is_checkpointable_results
            )
            if ok
            for f in module.forward_funcs[start : start + interval]
        ]
        assert recomputed == blocks[: full[stage]]
        assert module.mpu().get_data_parallel_world_size() == plan.d


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
