"""The plan as a DeepSpeed config JSON (for Megatron-DeepSpeed or a DeepSpeed engine).

Mapping: mb -> train_micro_batch_size_per_gpu, m -> gradient_accumulation_steps, B ->
train_batch_size (= mb * m * d, which DeepSpeed checks), zero/offload ->
zero_optimization (stage, offload_optimizer, offload_param), t -> tensor_parallel.autotp_size,
p -> pipeline.stages (DeepSpeed's pipeline engine runs a 1F1B-style schedule), recompute ->
activation_checkpointing. ``autoplan`` (ignored by DeepSpeed) records the full plan and
what DeepSpeed cannot express.
"""

from __future__ import annotations

from typing import Any

from autoplan.runtime.config import TrainSettings
from simulator.job import Job


def _notes(job: Job) -> list[str]:
    plan = job.plan
    notes = []
    if plan.p > 1 and plan.schedule != "1f1b":
        notes.append(f"schedule={plan.schedule}: DeepSpeed's pipeline engine only runs its 1F1B-style TrainSchedule")
    if plan.p > 1 and plan.zero >= 2:
        notes.append(f"zero={plan.zero} with p={plan.p}: DeepSpeed supports pipeline parallelism only with ZeRO-0/1")
    if plan.ckpt == "selective" or any(s for _, s in plan.chunk_recompute(job.model.num_layers)):
        notes.append(
            "selective recompute: DeepSpeed checkpoints whole layers (the model code decides what to recompute)"
        )
    if plan.sp:
        notes.append(
            "sp=1: Megatron sequence parallelism lives in the model code (Megatron-DeepSpeed --sequence-parallel)"
        )
    if plan.hsdp and plan.zero == 3:
        notes.append(
            f"hsdp={plan.hsdp}: written as MiCS (zero_optimization.mics_shard_size); build the model under "
            "deepspeed.zero.MiCS_Init, as DeepSpeed's MiCS tutorial does"
        )
    elif plan.hsdp:
        notes.append(f"hsdp={plan.hsdp} with zero={plan.zero}: DeepSpeed has no hybrid ZeRO-2; this shards over all d")
    return notes


def deepspeed_config(job: Job, train: TrainSettings) -> dict[str, Any]:
    plan = job.plan
    zero: dict[str, Any] = {"stage": plan.zero, "overlap_comm": True, "contiguous_gradients": True}
    if plan.zero in (1, 2):
        zero.update({"reduce_scatter": True, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000})
    if plan.hsdp and plan.zero == 3:  # MiCS: ZeRO-3 sharded within groups of hsdp ranks, replicated across
        zero["mics_shard_size"] = plan.hsdp
    if plan.offload != "none":
        off: dict[str, Any] = {"device": plan.offload, "pin_memory": True}
        if plan.offload == "nvme":
            off["nvme_path"] = "/local_nvme"
        zero["offload_optimizer"] = dict(off)
        if plan.zero == 3:
            zero["offload_param"] = dict(off)
    cfg: dict[str, Any] = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": plan.mb,
        "gradient_accumulation_steps": job.m,
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
        "tensor_parallel": {"autotp_size": plan.t},
        "pipeline": {
            "stages": plan.p,
            "partition": "uniform" if plan.layers is None else "parameters",
            "activation_checkpoint_interval": 1 if plan.ckpt == "full" else 0,
        },
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    full_layers = sum(f for f, _ in plan.chunk_recompute(job.model.num_layers))
    if full_layers:
        cfg["activation_checkpointing"] = {
            "partition_activations": bool(plan.sp),
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "number_checkpoints": full_layers,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    cfg["autoplan"] = {"plan": plan.to_dict(job.m), "data_parallel_size": plan.d, "notes": _notes(job)}
    return cfg
