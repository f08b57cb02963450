"""The plan for DeepSpeed 0.19: ``ds_config.json`` plus ``deepspeed_setup.py`` (pipeline module, recompute, mpu).

What DeepSpeed 0.19.8 reads, from its source (``deepspeed/runtime/...``):

- ``config.py``: ``train_batch_size`` must equal micro batch x ``gradient_accumulation_steps`` x the
  data-parallel size, which comes from the ``mpu`` given to ``deepspeed.initialize`` (without one:
  every rank, so t > 1 needs an mpu); ``pipeline.stages`` / ``pipeline.partition`` are never read;
  ``zero_optimization.mics_shard_size`` is rejected (MiCS was removed); unknown top-level keys
  are ignored (the ``autoplan`` record below).
- ``pipe/engine.py``: a pipeline runs ZeRO-0/1 only ("ZeRO-2 and ZeRO-3 are incompatible with
  pipeline parallelism"), one stage per rank with its 1F1B ``TrainSchedule``.
- ``pipe/module.py``: stages, layer split and recomputation come from the ``PipelineModule``
  (``partition_method`` cannot give an explicit split; ``activation_checkpoint_interval``
  recomputes every layer of a stage): ``deepspeed_setup.py`` builds it for the plan.
- ``engine.py``: t > 1 without a pipeline is AutoTP (``tensor_parallel.autotp_size``), with any
  ZeRO stage; AutoTP does not combine with the pipeline engine, so t > 1 with p > 1 needs
  tensor-parallel layers of the model's own (Megatron-DeepSpeed).

Closest runnable plan: ZeRO-2/3 with a pipeline -> ZeRO-1; interleaved -> one stage per rank;
GPipe -> 1F1B; hsdp -> sharding over all d; selective recomputation -> full (DeepSpeed
recomputes whole layers); AutoTP without sequence parallelism; prec=fp8 -> bf16; cp -> 1 (the cp
ranks become data-parallel ones).
"""

from __future__ import annotations

import json
from typing import Any

from autoplan.emit.export import Change, Draft, Export, fill_template, one_stage_per_rank, refuse
from autoplan.runtime.config import TrainSettings
from simulator.job import Job
from simulator.plan import Plan, num_microbatches

RELEASE = "DeepSpeed 0.19.8"
NVME_PATH = "/local_nvme"


def _decide(job: Job) -> Draft:
    plan, n = job.plan, job.model.num_layers
    d = Draft(job)
    if plan.p > 1 and plan.zero >= 2:
        also: dict[str, Any] = {"hsdp": 0}
        if plan.offload == "nvme":
            also["offload"] = "cpu"  # ZeRO-Infinity's NVMe needs stage 3
        d.change("zero", 1, "DeepSpeed's PipelineEngine runs ZeRO-0/1 only (runtime/pipe/engine.py)", **also)
    if plan.p > 1 and plan.v > 1:
        d.change("v", 1, "DeepSpeed's PipelineEngine runs one stage per rank", **one_stage_per_rank(plan, n))
        d.changes.append(Change("schedule", plan.schedule, "1f1b", "its only schedule with one stage per rank"))
    elif plan.p > 1 and plan.schedule == "gpipe":
        d.change("schedule", "1f1b", "DeepSpeed's PipelineEngine runs 1F1B (TrainSchedule): same bubble, less memory")
    elif plan.schedule == "zbh1":
        d.change("schedule", "1f1b", "DeepSpeed's PipelineEngine runs 1F1B (TrainSchedule) only: a larger bubble")
    if plan.hsdp and "hsdp" not in d.updates:
        why = "DeepSpeed 0.19 removed MiCS (runtime/config.py rejects mics_shard_size)" if plan.zero == 3 else ""
        d.change("hsdp", 0, why or "DeepSpeed has no hybrid ZeRO-2: it shards over all d ranks")
    if plan.cp > 1:
        d.change(
            "cp",
            1,
            "DeepSpeed's config has no ring attention (its sequence parallelism, Ulysses, is model code that "
            "splits heads with all-to-alls); the cp ranks join the data-parallel ones",
            d=plan.grad_group,
        )
    if plan.prec == "fp8":
        d.change(
            "prec", "bf16", "DeepSpeed's config has no fp8 training (its mixed precision is fp16 or bf16)", fp8ag=0
        )
    if plan.p == 1 and plan.t > 1 and plan.sp:
        d.change("sp", 0, "AutoTP splits the linear layers only; sequence parallelism is Megatron-DeepSpeed model code")
    if plan.p > 1 and plan.t > 1:
        d.notes.append(
            f"t={plan.t} with a pipeline: DeepSpeed's AutoTP does not combine with its pipeline engine; the blocks "
            "must be tensor-parallel themselves (Megatron-DeepSpeed's ParallelTransformerLayerPipe"
            + (", --sequence-parallel" if plan.sp else "")
            + "); deepspeed_setup.py places them on the topology"
        )
    written = d.plan()
    rec = written.chunk_recompute(n)
    if any(s for _, s in rec):
        why = "DeepSpeed recomputes whole layers; it has no selective (attention-only) recomputation"
        if written.recompute is None:
            d.change_recompute("full", None, why)
        else:
            d.change_recompute(written.ckpt, tuple((f + s, 0) for f, s in rec), why)
    if d.plan().offload == "nvme":
        d.notes.append(
            f"offload=nvme: set zero_optimization.offload_*.nvme_path (written: {NVME_PATH}) to a local NVMe"
        )
    return d


def deepspeed_config(job: Job, plan: Plan, train: TrainSettings, header: list[str]) -> dict[str, Any]:
    """ds_config.json for ``plan`` (the closest runnable plan), with what DeepSpeed reads only,
    plus the ignored ``autoplan`` record."""
    zero: dict[str, Any] = {"stage": plan.zero, "overlap_comm": True, "contiguous_gradients": True}
    if plan.zero in (1, 2):
        zero.update({"reduce_scatter": True, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000})
    if plan.offload != "none":
        off: dict[str, Any] = {"device": plan.offload, "pin_memory": True}
        if plan.offload == "nvme":
            off["nvme_path"] = NVME_PATH
        zero["offload_optimizer"] = dict(off)
        if plan.zero == 3:
            zero["offload_param"] = dict(off)
    m = num_microbatches(plan, job.global_batch)  # the plan it runs (cp -> 1 makes d larger)
    cfg: dict[str, Any] = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": plan.mb,
        "gradient_accumulation_steps": m,
        "gradient_clipping": train.max_norm,
        "bf16": {"enabled": True},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": train.lr,
                "betas": list(train.betas),
                "eps": train.eps,
                "weight_decay": train.weight_decay,
            },
        },
        "zero_optimization": zero,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if plan.p == 1 and plan.t > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.t}
    cfg["autoplan"] = {"about": header, "plan": job.plan.to_dict(job.m), "runs": plan.to_dict(m)}
    return cfg


def deepspeed_setup(job: Job, plan: Plan, header: list[str]) -> str:
    """deepspeed_setup.py: the shipped template with the plan's values and ``header`` in its docstring."""
    n = job.model.num_layers
    values = {
        "TENSOR": str(plan.t),
        "PIPELINE": str(plan.p),
        "DATA": str(plan.d),
        "STAGE_LAYERS: tuple[int, ...]": repr(tuple(plan.chunk_layers(n))),
        "FULL_RECOMPUTE: tuple[int, ...]": repr(tuple(f for f, _ in plan.chunk_recompute(n))),
    }
    return fill_template("deepspeed_setup.py", values, header)


def export_deepspeed(job: Job, train: TrainSettings) -> Export:
    if job.model.num_experts:
        return refuse(
            "deepspeed",
            RELEASE,
            f"{job.model.name} is a mixture of experts: DeepSpeed-MoE runs the model's own MoE layers "
            "(deepspeed.moe.layer.MoE), and deepspeed_setup.py builds dense blocks",
        )

    def render(plan: Plan, header: list[str]) -> dict[str, str]:
        return {
            "ds_config.json": json.dumps(deepspeed_config(job, plan, train, header), indent=2) + "\n",
            "deepspeed_setup.py": deepspeed_setup(job, plan, header),
        }

    return _decide(job).finish("deepspeed", RELEASE, render)
