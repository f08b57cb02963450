"""Start DeepSpeed's engine from every DeepSpeed export of the matrix, as a node of the plan would.

Run by tests/test_export_deepspeed_engine.py in processes of their own (``python deepspeed_engines.py
OUT.jsonl [PART PARTS]``: the cases whose index is PART modulo PARTS): DeepSpeed keeps process groups
and its mpu in module globals, so each fresh process starts its cases one after the other, and tears
each down with ``deepspeed.comm``'s own ``destroy_process_group``.

For each case the emitted files are written to a directory, and for the first rank of the first and
of the last pipeline stage:

* torch's fake process group (``torch.testing._internal.distributed.fake_pg``) makes this process
  that rank of the plan's world: every group DeepSpeed builds has the plan's sizes, and collectives
  return at once without moving data, so a 1,024-rank plan starts in a second;
* the model is built the way the files' docstring tells the user: a pipeline through the emitted
  ``pipeline_module`` (a stand-in layer list), otherwise a small Hugging Face ``LlamaForCausalLM`` or
  ``MixtralForCausalLM`` (what DeepSpeed's AutoTP and AutoEP shard) with the emitted
  ``recompute_blocks`` on its decoder layers;
* the emitted ``initialize`` starts ``deepspeed.initialize`` on the emitted ds_config.json;
* without a pipeline the engine then runs one forward, backward and optimizer step.

What DeepSpeed built is written as one JSON line per rank (or the error it raised). On CPU two
things of ds_config.json cannot run and are swapped, as the DualPipeV step test does: the fused
AdamW (a CUDA kernel) for torch's Adam, and with it ``zero_force_ds_cpu_optimizer`` off (an
offloading ZeRO otherwise demands DeepSpeed's CPUAdam, a C++ op built on first use). bf16, ZeRO,
offload, buckets, batch sizes, the scheduler and the pipeline stay as emitted. With AutoTP the
engine's one-time check that every rank of a tensor group got the same batch is removed: it sums a
flag over the group, which a fake all-reduce never does. DeepSpeed's shared-memory CPU all-reduce is
off, and an NVMe-offloading case is not started where libaio is missing: both would compile a C++ op
first (tests/deepspeed_cpu.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
import transformers
from deepspeed import comm as ds_comm
from deepspeed_cpu import nvme_refusal, without_shm_comm
from export_matrix import CASES, Case, job_of
from torch import nn
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.emit.deepspeed import export_deepspeed
from autoplan.runtime.config import TrainSettings
from simulator.cost.layout import rank_of
from simulator.job import Job

#: the small models' width, MLP width, heads, key-value heads (as many as the widest tensor group of
#: the matrix, t = 8, so that AutoTP splits them), vocabulary and tokens per sample
HIDDEN, FFN, HEADS, KV_HEADS, VOCAB, TOKENS = 128, 256, 16, 8, 256, 16


class Block(nn.Module):
    """A transformer block's stand-in in a pipeline's layer list."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def hf_model(layers: int, experts: int | None) -> nn.Module:
    """A small Hugging Face decoder with ``layers`` layers: Mixtral with ``experts`` experts (top 2),
    else Llama."""
    shape = dict(
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
    )
    if experts:
        return transformers.MixtralForCausalLM(
            transformers.MixtralConfig(**shape, num_local_experts=experts, num_experts_per_tok=2)
        )
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))


def write_files(job: Job, root: Path) -> tuple[Any, ModuleType] | str:
    """The DeepSpeed export of a case's ``job`` written under ``root`` (the CPU swaps of the module
    docstring), and its deepspeed_setup.py loaded; or the export's refusal."""
    export = export_deepspeed(job, TrainSettings())
    if export.refused:
        return export.refused
    for name, text in export.files.items():
        (root / name).write_text(text)
    config = json.loads((root / "ds_config.json").read_text())
    config["optimizer"] = {"type": "Adam", "params": {**config["optimizer"]["params"], "torch_adam": True}}
    config["zero_force_ds_cpu_optimizer"] = False
    config["csv_monitor"]["output_path"] = str(root / "logs")
    (root / "ds_config.json").write_text(json.dumps(config))
    spec = importlib.util.spec_from_file_location(f"deepspeed_setup_{abs(hash(root))}", root / "deepspeed_setup.py")
    assert spec and spec.loader
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    return export.written, setup


def become(rank: int, world: int) -> None:
    """This process as ``rank`` of ``world`` on the fake process group, DeepSpeed's comm over it."""
    if dist.is_initialized():
        ds_comm.destroy_process_group()
    os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    deepspeed.init_distributed()


def start(plan: Any, setup: ModuleType, experts: int | None, stage: int) -> dict[str, Any]:
    """The engine of the first rank of pipeline stage ``stage``, and what it runs."""
    rank = rank_of(stage, 0, 0, plan.t, plan.d)
    become(rank, plan.gpus)
    torch.manual_seed(0)
    blocks = sum(setup.STAGE_LAYERS)
    with contextlib.redirect_stdout(io.StringIO()):
        if plan.p > 1:
            layers = [nn.Embedding(VOCAB, HIDDEN), *(Block() for _ in range(blocks)), nn.LayerNorm(HIDDEN)]
            model = setup.pipeline_module([*layers, nn.Linear(HIDDEN, VOCAB)], Block, loss_fn=nn.functional.mse_loss)
        else:
            model = hf_model(blocks, experts)
            setup.recompute_blocks(model.model.layers)
        engine, optimizer, _, scheduler = setup.initialize(model)
    seen = {
        "rank": rank,
        "engine": type(engine).__name__,
        "optimizer": type(optimizer).__name__,
        "scheduler": type(scheduler).__name__,
        "zero": engine.zero_optimization_stage(),
        "dp": engine.dp_world_size,
        "mp": engine.mp_world_size,
        "gas": engine.gradient_accumulation_steps(),
        "mb": engine.train_micro_batch_size_per_gpu(),
        "cpu_offload": bool(engine.zero_cpu_offload()),
        "bf16": bool(engine.bfloat16_enabled()),
    }
    if plan.p > 1:
        return seen | {"stages": engine.num_stages, "stage": engine.stage_id}
    return seen | shards(engine.module) | {"loss": step(engine)}


def shards(model: nn.Module) -> dict[str, Any]:
    """The rank's share of layer 0: rows of its query projection (AutoTP splits them t ways) and
    experts held (AutoEP keeps E / ep whole experts; the model's own MoE holds all)."""
    layer = model.model.layers[0]
    q = layer.self_attn.q_proj.weight
    out: dict[str, Any] = {"q_rows": int(getattr(q, "ds_shape", q.shape)[0])}
    experts = getattr(layer.mlp, "experts", None)
    if experts is not None:  # each expert weight is one 3-D tensor, experts first (HF's and AutoEP's)
        w = next(experts.parameters())
        out["experts"] = int(getattr(w, "ds_shape", w.shape)[0])
    return out


def step(engine: Any) -> float:
    """One forward, backward and optimizer step of a batch of token ids; the loss."""
    check = getattr(engine, "first_dataloader_check", None)
    if check is not None:
        check.remove()
    ids = torch.randint(0, VOCAB, (engine.train_micro_batch_size_per_gpu(), TOKENS))
    with contextlib.redirect_stdout(io.StringIO()):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    return float(loss.detach())


def run_case(index: int, case: Case) -> list[dict[str, Any]]:
    """One JSON record per started rank of ``case`` (CASES[index]): what its engine runs, or the error."""
    job = job_of(case)
    with tempfile.TemporaryDirectory() as tmp:
        got = write_files(job, Path(tmp))
        if isinstance(got, str):
            return [{"case": index, "refused": got}]
        plan, setup = got
        experts = job.model.num_experts
        stages = sorted({0, plan.p - 1})
        if plan.offload == "nvme" and (why := nvme_refusal()):  # not started: it would compile an op, then fail
            return [{"case": index, "rank": rank_of(s, 0, 0, plan.t, plan.d), "nvme_refused": why} for s in stages]
        out = []
        for stage in stages:
            try:
                out.append({"case": index} | start(plan, setup, experts, stage))
            except Exception as e:  # the test reports what DeepSpeed raised
                last = traceback.extract_tb(e.__traceback__)[-1]
                where = f"{Path(last.filename).name}:{last.lineno}"
                error = f"{type(e).__name__} at {where}: {e}"
                out.append({"case": index, "rank": rank_of(stage, 0, 0, plan.t, plan.d), "error": error})
        return out


def main(path: str, part: int = 0, parts: int = 1) -> None:
    """The records of every case whose index is ``part`` modulo ``parts`` (the test starts one
    process per part, side by side), written to ``path``."""
    without_shm_comm()
    with open(path, "w") as f:
        for index, case in enumerate(CASES):
            if index % parts != part:
                continue
            for record in run_case(index, case):
                f.write(json.dumps(record) + "\n")
                f.flush()


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
