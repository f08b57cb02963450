"""The plan for DeepSpeed 0.19: ``ds_config.json`` plus ``deepspeed_setup.py`` (pipeline module, recompute, mpu).

What DeepSpeed 0.19.8 reads, from its source (``deepspeed/runtime/...``):

- ``config.py``: ``train_batch_size`` must equal micro batch x ``gradient_accumulation_steps`` x the
  data-parallel size, which comes from the ``mpu`` given to ``deepspeed.initialize`` (without one:
  every rank, so t > 1 needs an mpu); ``pipeline.stages`` / ``pipeline.partition`` are never read;
  ``zero_optimization.mics_shard_size`` is rejected (MiCS was removed); unknown top-level keys
  are ignored (the ``autoplan`` record below).
- ``pipe/engine.py``: a pipeline runs ZeRO-0/1 only ("ZeRO-2 and ZeRO-3 are incompatible with
  pipeline parallelism"), one stage per rank with its 1F1B ``TrainSchedule``.
- ``pipe/dualpipev.py``: ZB-V's placement, two stages per rank in a V (rank r: stages r and
  2p-1-r), is ``DualPipeVModule``, which ``deepspeed.initialize`` runs with ``DualPipeVEngine``
  (``engine_cls = DualPipeVEngine if isinstance(model, DualPipeVModule) else PipelineEngine``,
  ``deepspeed/__init__.py``). ``DualPipeVEngine.__init__`` asserts "DualPipeV needs
  gradient_accumulation_steps >= 2 * {num_stages}" and "DualPipeV does not support
  pipe_partitioned or grad_partitioned" (both on by default, ``runtime/config.py``, and in effect
  with model parallelism: ``ds_config.json`` turns them off). Its ``DualPipeVSchedule``
  (``pipe/schedule.py``) "keeps them [the weight gradients] inside ``BackwardPass``": the V runs,
  without ZB-V's deferred weight passes (noted).
- ``pipe/module.py``: stages, layer split and recomputation come from the ``PipelineModule``
  (``partition_method`` cannot give an explicit split; ``activation_checkpoint_interval``
  recomputes every layer of a stage): ``deepspeed_setup.py`` builds it for the plan.
- ``engine.py``: t > 1 without a pipeline is AutoTP (``tensor_parallel.autotp_size``), with any
  ZeRO stage; AutoTP does not combine with the pipeline engine, so t > 1 with p > 1 needs
  tensor-parallel layers of the model's own (Megatron-DeepSpeed).

- A mixture of experts (the model's own MoE layers, e.g. a Hugging Face Mixtral): ep > 1 is
  AutoEP (``expert_parallel`` in the config, read by ``runtime/config.py``
  ``get_expert_parallel_config``; ``DeepSpeedEngine._configure_expert_parallel``, ``engine.py``,
  replaces the MoE layers with ``AutoEPMoELayer`` over expert groups of ``autoep_size`` ranks cut
  from the data-parallel ranks, ``utils/groups.py`` ``_create_expert_and_data_parallel``), the
  routing set to autoplan's (softmax, top k, renormalized). Refused where AutoEP cannot run the
  plan: t > 1, which AutoEP runs only as AutoEP+AutoTP folding with p = 1, each expert whole on
  an expert group spanning the tensor lanes (``module_inject/auto_ep_folding.py``
  ``validate_folding_global``: "AutoEP+AutoTP folding requires expert_parallel.autoep_size > 1",
  "AutoEP+AutoTP folding currently supports pp_size=1 only"; ``engine.py``
  ``_configure_expert_parallel``: "AutoEP does not currently support tensor model parallelism from
  mpu") where autoplan prices Megatron's split of every expert over the t ranks; and ep > 1 with
  p > 1, since ``AutoEP.ep_parser`` (``module_inject/auto_ep.py``) finds MoE layers only by a
  module name that fullmatches the preset's ``moe_layer_pattern`` (Mixtral's
  ``r"model\\.layers\\.\\d+\\.mlp"``, ``module_inject/auto_ep_presets/mixtral.py``) and reads the
  expert count from ``model.config``, while a ``PipelineModule`` names its layers by index
  (``PipelineModule._build``, ``pipe/module.py``: ``name = str(layer_idx)``) and has no config.

Closest runnable plan: ZeRO-2/3 with a pipeline -> ZeRO-1; interleaved (and zbv with fewer than
2p microbatches) -> one stage per rank;
GPipe -> 1F1B; hsdp -> sharding over all d; selective recomputation -> full (DeepSpeed
recomputes whole layers); AutoTP without sequence parallelism; prec=fp8 -> bf16; cp -> 1 (the cp
ranks become data-parallel ones).
"""

from __future__ import annotations

import json
from typing import Any

from autoplan.emit.export import Change, Draft, Export, fill_template, one_stage_per_rank, refuse
from autoplan.emit.schedule import TrainingSchedule, training_schedule
from autoplan.runtime.config import TrainSettings
from simulator.job import Job
from simulator.plan import Plan, num_microbatches

RELEASE = "DeepSpeed 0.19.8"
NVME_PATH = "/local_nvme"


def _decide(job: Job) -> Draft:
    """The closest plan DeepSpeed runs (module docstring): its pipeline, its sharding and
    precision, its recomputation, and the notes on what it runs differently."""
    d = Draft(job)
    _pipeline_draft(job, d)
    _sharding_draft(job, d)
    _recompute_draft(job, d)
    _notes_draft(job, d)
    return d


def _pipeline_draft(job: Job, d: Draft) -> None:
    """ZeRO-0/1 under the pipeline engine; ZB-V as DualPipeV (or one stage per rank with too few
    microbatches); interleaved as one stage per rank; GPipe and ZB-H1 as 1F1B."""
    plan, n = job.plan, job.model.num_layers
    if plan.p > 1 and plan.zero >= 2:
        also: dict[str, Any] = {"hsdp": 0}
        if plan.offload == "nvme":
            also["offload"] = "cpu"  # ZeRO-Infinity's NVMe needs stage 3
        d.change("zero", 1, "DeepSpeed's PipelineEngine runs ZeRO-0/1 only (runtime/pipe/engine.py)", **also)
    m = num_microbatches(plan.replace(d=plan.grad_group) if plan.cp > 1 else plan, job.global_batch)
    if plan.schedule == "zbv" and m >= 2 * plan.p:
        d.notes.append(
            "schedule=zbv: DeepSpeed's DualPipeVModule/DualPipeVEngine run the V (rank r: stages r and 2p-1-r), "
            "but its DualPipeVSchedule keeps the weight gradients inside BackwardPass (runtime/pipe/schedule.py): "
            "no deferred weight passes fill the bubble, which autoplan prices as ZB-V's"
        )
    elif plan.schedule == "zbv":
        d.change(
            "v",
            1,
            f"DeepSpeed's DualPipeVEngine.__init__ (runtime/pipe/dualpipev.py) asserts 'DualPipeV needs "
            f"gradient_accumulation_steps >= 2 * {plan.p}' ({m} microbatches); its PipelineEngine runs one stage "
            "per rank",
            **one_stage_per_rank(plan, n),
        )
        d.changes.append(Change("schedule", plan.schedule, "1f1b", "its only schedule with one stage per rank"))
    elif plan.p > 1 and plan.v > 1:
        d.change("v", 1, "DeepSpeed's PipelineEngine runs one stage per rank", **one_stage_per_rank(plan, n))
        d.changes.append(Change("schedule", plan.schedule, "1f1b", "its only schedule with one stage per rank"))
    elif plan.p > 1 and plan.schedule == "gpipe":
        d.change("schedule", "1f1b", "DeepSpeed's PipelineEngine runs 1F1B (TrainSchedule): same bubble, less memory")
    elif plan.schedule == "zbh1":
        d.change("schedule", "1f1b", "DeepSpeed's PipelineEngine runs 1F1B (TrainSchedule) only: a larger bubble")


def _sharding_draft(job: Job, d: Draft) -> None:
    """No hybrid sharding, no ring attention, no fp8, no sequence parallelism under AutoTP."""
    plan = job.plan
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


def _recompute_draft(job: Job, d: Draft) -> None:
    """Selective recomputation as full: DeepSpeed recomputes whole layers."""
    written = d.plan()
    rec = written.chunk_recompute(job.model.num_layers)
    if any(s for _, s in rec):
        why = "DeepSpeed recomputes whole layers; it has no selective (attention-only) recomputation"
        if written.recompute is None:
            d.change_recompute("full", None, why)
        else:
            d.change_recompute(written.ckpt, tuple((f + s, 0) for f, s in rec), why)


def _notes_draft(job: Job, d: Draft) -> None:
    """What the files need from the user's model code or machine: tensor-parallel pipeline blocks,
    the model's own MoE layers, the NVMe path."""
    plan = job.plan
    if plan.p > 1 and plan.t > 1:
        d.notes.append(
            f"t={plan.t} with a pipeline: DeepSpeed's AutoTP does not combine with its pipeline engine; the blocks "
            "must be tensor-parallel themselves (Megatron-DeepSpeed's ParallelTransformerLayerPipe"
            + (", --sequence-parallel" if plan.sp else "")
            + "); deepspeed_setup.py places them on the topology"
        )
    if job.model.num_experts:
        d.notes.append(
            "mixture of experts: the model's own MoE layers (a Hugging Face Mixtral, transformers >= 5: AutoEP's "
            "preset; below 5.23, whose _CAN_RECORD_REGISTRY.get takes no default, which AutoEP's presets pass); "
            + (
                f"AutoEP splits the {job.model.num_experts} experts over ep={plan.ep} ranks (ds_config.json "
                "expert_parallel: softmax router, top k renormalized), with all-to-all token exchange"
                if plan.ep > 1
                else "ep=1: every rank holds every expert"
            )
            + f"; autoplan prices Megatron-core's all-to-all dispatcher with "
            f"moe_load_imbalance={job.model.moe_load_imbalance}"
        )
    if d.plan().offload == "nvme":
        d.notes.append(
            f"offload=nvme: set zero_optimization.offload_*.nvme_path (written: {NVME_PATH}) to a local NVMe"
        )


def experts_refusal(job: Job) -> str | None:
    """Why DeepSpeed 0.19.8's AutoEP cannot run this mixture-of-experts plan, or None (dense, or it can)."""
    m, plan = job.model, job.plan
    if not m.num_experts:
        return None
    if plan.t > 1:
        return (
            f"{m.name} is a mixture of experts with t={plan.t}: DeepSpeed combines its expert parallelism (AutoEP) "
            "with tensor parallelism only as AutoEP+AutoTP folding, each expert whole on an expert group spanning "
            "the tensor lanes, where autoplan prices Megatron's split of every expert over the t ranks; and "
            "module_inject/auto_ep_folding.py validate_folding_global raises 'AutoEP+AutoTP folding requires "
            "expert_parallel.autoep_size > 1' (ep=1) and 'AutoEP+AutoTP folding currently supports pp_size=1 only' "
            "(p > 1), runtime/engine.py _configure_expert_parallel 'AutoEP does not currently support tensor model "
            "parallelism from mpu' (a pipeline's tensor ranks); plan with t=1"
        )
    if plan.p > 1 and plan.ep > 1:
        return (
            f"{m.name} with ep={plan.ep} and p={plan.p}: DeepSpeed's AutoEP.ep_parser (module_inject/auto_ep.py) "
            "skips every module whose name does not fullmatch the preset's moe_layer_pattern (Mixtral's "
            "'model\\.layers\\.\\d+\\.mlp', module_inject/auto_ep_presets/mixtral.py) and reads the expert count "
            "from model.config, while a PipelineModule names its layers by index (PipelineModule._build, "
            "runtime/pipe/module.py: 'name = str(layer_idx)') and has no config: the experts would stay whole on "
            "every rank; plan with p=1, or ep=1"
        )
    return None


def deepspeed_config(
    job: Job, plan: Plan, train: TrainSettings, schedule: TrainingSchedule, header: list[str]
) -> dict[str, Any]:
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
        "scheduler": scheduler(schedule),
        "zero_optimization": zero,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
        # the loss and learning rate per step as CSV files (deepspeed/monitor/csv_monitor.py: no package needed,
        # where its "tensorboard" monitor fails without the tensorboard package)
        "csv_monitor": {"enabled": True, "output_path": "logs", "job_name": "autoplan"},
    }
    if plan.p == 1 and plan.t > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.t}
    if job.model.num_experts and plan.ep > 1:  # AutoEP, with autoplan's (Mixtral's) routing
        cfg["expert_parallel"] = {
            "enabled": True,
            "autoep_size": plan.ep,
            "top_k": job.model.moe_router_topk,
            "score_func": "softmax",
            "route_norm": True,
        }
    if plan.schedule == "zbv":  # DualPipeVEngine: "DualPipeV does not support pipe_partitioned or grad_partitioned"
        cfg["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    cfg["autoplan"] = {"about": header, "plan": job.plan.to_dict(job.m), "runs": plan.to_dict(m)}
    return cfg


def scheduler(schedule: TrainingSchedule) -> dict[str, Any]:
    """``WarmupCosineLR`` (deepspeed/runtime/lr_schedules.py) for the training schedule: a linear
    warm-up from 0 over ``warmup_num_steps``, then the cosine to ``cos_min_ratio`` of the peak at
    ``total_num_steps`` (DeepSpeed holds it there after)."""
    return {
        "type": "WarmupCosineLR",
        "params": {
            "total_num_steps": schedule.decay_iters,
            "warmup_num_steps": schedule.warmup_iters,
            "warmup_min_ratio": 0.0,
            "warmup_type": "linear",
            "cos_min_ratio": schedule.min_lr_share,
        },
    }


def deepspeed_setup(job: Job, plan: Plan, schedule: TrainingSchedule, header: list[str]) -> str:
    """deepspeed_setup.py: the shipped template with the plan's values and ``header`` in its docstring."""
    n = job.model.num_layers
    values = {
        "TENSOR": str(plan.t),
        "PIPELINE": str(plan.p),
        "DATA": str(plan.d),
        "STAGE_LAYERS: tuple[int, ...]": repr(tuple(plan.chunk_layers(n))),
        "FULL_RECOMPUTE: tuple[int, ...]": repr(tuple(f for f, _ in plan.chunk_recompute(n))),
        "DUALPIPEV": repr(plan.schedule == "zbv"),
        "TRAIN_ITERS": str(schedule.train_iters),
    }
    return fill_template("deepspeed_setup.py", values, header)


def export_deepspeed(job: Job, train: TrainSettings) -> Export:
    why = experts_refusal(job)
    if why:
        return refuse("deepspeed", RELEASE, why)

    schedule = training_schedule(job.model, job.global_batch, train)

    def render(plan: Plan, header: list[str]) -> dict[str, str]:
        return {
            "ds_config.json": json.dumps(deepspeed_config(job, plan, train, schedule, header), indent=2) + "\n",
            "deepspeed_setup.py": deepspeed_setup(job, plan, schedule, header),
        }

    return _decide(job).finish("deepspeed", RELEASE, render)
