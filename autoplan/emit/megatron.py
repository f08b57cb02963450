"""The plan for Megatron-LM: ``pretrain_gpt.py`` arguments and the launch script with their environment.

Checked against Megatron-LM ``main`` at d98e8a6 (2026-08-22: ``megatron/training/arguments.py``
``parse_args`` + ``validate_args``) and megatron-core 0.16.1's ``TransformerConfig``. Mapping:

- t, p -> ``--tensor/pipeline-model-parallel-size``; d is what remains of the world size (/ cp).
  t > 1 or cp > 1 needs ``CUDA_DEVICE_MAX_CONNECTIONS=1`` before Blackwell (``validate_args``), while
  Megatron-FSDP wants it unset or > 1: ``megatron_launch.sh`` exports what the plan needs.
- Layer split: uniform -> nothing (or ``--num-layers-per-virtual-pipeline-stage`` when
  interleaved); any other split -> ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t*n``
  layers, ``L`` loss; segment i is virtual chunk i // p of pipeline rank i % p, the looped
  placement autoplan plans), since first/last-stage counts only express an even middle.
- sp -> ``--sequence-parallel``; ZeRO-1 -> ``--use-distributed-optimizer``; ZeRO-2/3 ->
  Megatron-FSDP (``--use-megatron-fsdp``, ``--data-parallel-sharding-strategy optim_grads`` /
  ``optim_grads_params``, ``--ckpt-format fsdp_dtensor``); hsdp=N ->
  ``--num-distributed-optimizer-instances d/N`` (shards within d/instances consecutive ranks,
  replicates across: ``param_and_grad_buffer.py``).
- offload=cpu -> ``--optimizer-cpu-offload --use-precision-aware-optimizer`` (asserted together);
  Megatron keeps the bf16 parameters and the gradient buffer on the GPU (stated, with its size).
- Recomputation: Megatron has one granularity for the whole model; full recomputation is
  ``--recompute-method block --recompute-num-layers N``: the first N layers of every chunk
  (``transformer_block.py``); selective (``core_attn``) covers every layer.
- Llama-style models: ``--rotary-base``, ``--swiglu``, GQA, RMSNorm, untied embeddings;
  materialised attention -> ``--attention-backend unfused``.
- cp -> ``--context-parallel-size`` (with ``--cp-comm-type``'s default ``p2p``: Transformer
  Engine's K/V ring, the one autoplan prices); the distributed optimizer shards over dp x cp.
- Mixture of experts -> ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``
  (the model's ffn: the expert width) and the all-to-all token dispatcher autoplan prices; ep ->
  ``--expert-model-parallel-size`` (expert tensor parallelism left at its default, t).
- prec=fp8 -> ``--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max``
  (Transformer Engine layers, Megatron's default ``--transformer-impl``); fp8ag=1 ->
  ``--fp8-param-gather`` (fp8 parameters gathered in fp8 by the distributed optimizer or
  Megatron-FSDP).

Closest runnable plan: GPipe -> 1F1B; NVMe offload -> CPU; recomputation as Megatron can
express it (same N in every chunk, one granularity).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import replace

from autoplan.emit.export import Draft, Export, one_stage_per_rank
from autoplan.emit.megatron_launch import megatron_launch
from autoplan.emit.safe_text import comment_lines
from autoplan.emit.schedule import TrainingSchedule, training_schedule
from autoplan.runtime.config import TrainSettings
from simulator.job import Job
from simulator.plan import Plan

RELEASE = "Megatron-LM main (d98e8a6, 2026-08-22) / megatron-core 0.16"
VOCAB_MULTIPLE = 128  # --make-vocab-size-divisible-by default: the vocabulary is padded to 128 * t


def _model_args(job: Job) -> list[str]:
    m = job.model
    args = [
        "--num-layers",
        str(m.num_layers),
        "--hidden-size",
        str(m.hidden_size),
        "--num-attention-heads",
        str(m.num_attention_heads),
        "--ffn-hidden-size",
        str(m.ffn),
        "--seq-length",
        str(m.seq_length),
        "--max-position-embeddings",
        str(m.seq_length),
        "--position-embedding-type",
        m.position_embedding_type,
        "--normalization",
        m.normalization,
    ]
    if m.position_embedding_type == "rope":
        args += ["--rotary-base", str(int(m.rope_theta))]
    if m.kv_heads != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.activation == "swiglu":
        args.append("--swiglu")
    if m.normalization == "RMSNorm":
        args.append("--disable-bias-linear")
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if m.attention == "materialized":
        args += ["--attention-backend", "unfused"]
    if m.num_experts:  # every layer a mixture of experts (simulator.cost.experts)
        args += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.moe_router_topk)]
        args += ["--moe-ffn-hidden-size", str(m.ffn), "--moe-token-dispatcher-type", "alltoall"]
    return args


def pipeline_layout(sizes: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout``: one ``|``-separated segment per pipeline chunk, the
    embedding ``E`` first and the loss ``L`` last (``pipeline_parallel_layer_layout.py``)."""
    parts = [f"t*{n}" for n in sizes]
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return "|".join(parts)


def _layer_args(job: Job, plan: Plan) -> list[str]:
    sizes = plan.chunk_layers(job.model.num_layers)
    if len(set(sizes)) > 1:
        return ["--pipeline-model-parallel-layout", pipeline_layout(sizes)]
    if plan.v > 1:
        return ["--num-layers-per-virtual-pipeline-stage", str(sizes[0])]
    return []


def _data_parallel_args(plan: Plan) -> list[str]:
    if plan.zero == 1:
        args = ["--use-distributed-optimizer"]
    elif plan.zero >= 2:
        args = [
            "--use-distributed-optimizer",
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy",
            "optim_grads" if plan.zero == 2 else "optim_grads_params",
            "--no-gradient-accumulation-fusion",
            "--ckpt-format",
            "fsdp_dtensor",
        ]
    else:
        args = []
    if plan.hsdp:
        args += ["--num-distributed-optimizer-instances", str(plan.replicas)]
    if plan.offload == "cpu":
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0", "--use-precision-aware-optimizer"]
    return args


def _recompute_args(job: Job, plan: Plan) -> list[str]:
    rec = plan.chunk_recompute(job.model.num_layers)
    full = max(f for f, _ in rec)
    if full:
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(full)]
    if any(s for _, s in rec):
        return ["--recompute-granularity", "selective"]
    return []


def _train_args(train: TrainSettings, schedule: TrainingSchedule) -> list[str]:
    """The optimizer, its learning-rate schedule (autoplan.emit.schedule: warm-up, then cosine decay
    to ``--min-lr``) and what the run logs; the data, the length and the checkpoints are the
    launcher's (megatron_launch.sh)."""
    return [
        "--bf16",
        "--optimizer",
        "adam",
        "--lr",
        str(schedule.lr),
        "--min-lr",
        str(schedule.min_lr),
        "--lr-decay-style",
        "cosine",
        "--lr-warmup-iters",
        str(schedule.warmup_iters),
        "--lr-decay-iters",
        str(schedule.decay_iters),
        "--adam-beta1",
        str(train.betas[0]),
        "--adam-beta2",
        str(train.betas[1]),
        "--adam-eps",
        str(train.eps),
        "--weight-decay",
        str(train.weight_decay),
        "--clip-grad",
        str(train.max_norm),
        "--attention-dropout",
        "0",
        "--hidden-dropout",
        "0",
        "--seed",
        str(train.seed),
        "--log-interval",
        "10",
        "--log-throughput",
        "--log-timers-to-tensorboard",
    ]


def megatron_args(job: Job, plan: Plan, train: TrainSettings) -> list[str]:
    """The ``pretrain_gpt.py`` argument list for ``plan`` (the plan Megatron runs)."""
    parallel = ["--tensor-model-parallel-size", str(plan.t), "--pipeline-model-parallel-size", str(plan.p)]
    if plan.cp > 1:
        parallel += ["--context-parallel-size", str(plan.cp)]
    if plan.ep > 1:
        parallel += ["--expert-model-parallel-size", str(plan.ep)]
    parallel += _layer_args(job, plan)
    if plan.sp:
        parallel.append("--sequence-parallel")
    parallel += ["--micro-batch-size", str(plan.mb), "--global-batch-size", str(job.global_batch)]
    schedule = training_schedule(job.model, job.global_batch, train)
    args = _model_args(job) + parallel + _data_parallel_args(plan) + _recompute_args(job, plan)
    args += _train_args(train, schedule)
    return args + _precision_args(plan) + overlap_args(plan)


def overlap_args(plan: Plan) -> list[str]:
    """The overlaps the prediction assumes (autoplan/frameworks/profiles/megatron.yaml):
    ``--overlap-grad-reduce`` (bucketed gradient reductions during the backward, the profile's
    ``dp_overlap``) and, with a sharded optimizer, ``--overlap-param-gather`` (the updated
    parameters gathered during the next forward), over more than one data-parallel rank;
    ``--tp-comm-overlap`` (Transformer Engine's userbuffers overlap of the sequence-parallel
    collectives with the GEMMs, the profile's ``layer_kernels: fused-tp-overlap``) with t > 1 and
    sequence parallelism, which ``validate_args`` requires for it."""
    args = []
    if plan.d * plan.cp > 1:
        args.append("--overlap-grad-reduce")
        if plan.zero >= 1:
            args.append("--overlap-param-gather")
    if plan.sp and plan.t > 1:
        args.append("--tp-comm-overlap")
    return args


def _precision_args(plan: Plan) -> list[str]:
    """prec=fp8: Transformer Engine's hybrid recipe (e4m3 forward, e5m2 gradients) with delayed
    scaling over a 1024-step amax history, as NeMo's GPT-3 fp8 recipes set it; fp8ag=1: the
    parameters kept and all-gathered in fp8 (``--fp8-param-gather``)."""
    if plan.prec != "fp8":
        return []
    recipe = ["--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"]
    return recipe + (["--fp8-param-gather"] if plan.fp8ag else [])


def _recompute_draft(d: Draft) -> None:
    """What Megatron can recompute: one granularity, and for full recomputation the same first N
    layers of every chunk; the closest plan recomputes at least what the plan does."""
    n = d.job.model.num_layers
    plan = d.plan()
    rec, sizes = plan.chunk_recompute(n), plan.chunk_layers(n)
    has_full, has_sel = any(f for f, _ in rec), any(s for _, s in rec)
    if has_sel and not has_full:
        if any(s != size for (_, s), size in zip(rec, sizes)):
            why = "Megatron's selective recomputation covers every layer (--recompute-num-layers must be unset)"
            d.change_recompute("selective", None, why)
        return
    if not has_full:
        return
    merged = [f + s for f, s in rec]
    top = max(merged)
    target = tuple((min(top, size), 0) for size in sizes)
    if target == tuple(rec):
        return
    if all(f == size for (f, _), size in zip(target, sizes)):
        d.change_recompute("full", None, _recompute_reason(has_sel, top))
    else:
        d.change_recompute(plan.ckpt, target, _recompute_reason(has_sel, top))


def _recompute_reason(has_sel: bool, top: int) -> str:
    why = f"Megatron's block method recomputes the same first --recompute-num-layers {top} of every chunk"
    if has_sel:
        why = (
            "Megatron has one recompute granularity, so the selective layers recompute in full; "
            + why[0].lower()
            + why[1:]
        )
    return why


def _memory_notes(job: Job, written: Plan) -> list[str]:
    notes = []
    if written.offload == "cpu":
        from simulator.analytic import estimate

        planned = estimate(replace(job, plan=written)).memory_breakdown
        on_gpu = estimate(replace(job, plan=written.replace(offload="none"))).memory_breakdown
        extra = on_gpu["params"] + on_gpu["grads"] - planned["params"] - planned["grads"]
        notes.append(
            "offload=cpu: Megatron offloads the optimizer (fp32 master and Adam state) and keeps the bf16 "
            f"parameters and the gradient buffer on the GPU: {extra / 2**30:+.1f} GiB per GPU beside the plan's memory"
        )
    v, t = job.model.vocab_size, written.t
    padded = math.ceil(v / (VOCAB_MULTIPLE * t)) * VOCAB_MULTIPLE * t
    if padded != v:
        notes.append(f"Megatron pads the vocabulary from {v} to {padded} (a multiple of 128*t)")
    return notes


def _decide(job: Job) -> Draft:
    plan = job.plan
    d = Draft(job)
    if plan.p > 1 and plan.schedule == "gpipe":
        d.change("schedule", "1f1b", "Megatron-LM has no GPipe schedule; 1F1B has the same bubble and less memory")
    if plan.schedule == "zbh1":
        d.change(
            "schedule",
            "1f1b",
            "Megatron-LM has no zero-bubble schedule (megatron/core/pipeline_parallel/schedules.py: 1F1B, "
            "interleaved); 1F1B has its memory and a larger bubble",
        )
    if plan.schedule == "zbv":
        d.change(
            "schedule",
            "1f1b",
            "Megatron-LM has no zero-bubble schedule (megatron/core/pipeline_parallel/schedules.py: 1F1B, "
            "interleaved, whose chunks are looped, not in a V): one 1F1B stage per rank with its layers",
            **one_stage_per_rank(plan, job.model.num_layers),
        )
    if plan.offload == "nvme":
        d.change("offload", "cpu", "Megatron-LM has no NVMe offload (DeepSpeed's ZeRO-Infinity does)")
    _recompute_draft(d)
    d.notes += _memory_notes(job, d.plan())
    return d


def megatron_args_text(job: Job, plan: Plan, train: TrainSettings, header: list[str]) -> str:
    """The arguments one per line (flag and its value), after '#' comment lines; read with
    ``shlex.split(text, comments=True)`` or ``grep -v '^#' megatron_args.txt | xargs``."""
    args = megatron_args(job, plan, train)
    lines = [comment_lines(header)]
    split = "t*cp*p" if plan.cp > 1 else "t*p"
    lines.append(f"# {plan.gpus} ranks (data-parallel size {plan.d} = world / ({split})); run with megatron_launch.sh")
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(args[i])
            i += 1
    return "\n".join(lines) + "\n"


def export_megatron(job: Job, train: TrainSettings) -> Export:
    def render(plan: Plan, header: list[str]) -> dict[str, str]:
        return {
            "megatron_args.txt": megatron_args_text(job, plan, train, header),
            "megatron_launch.sh": megatron_launch(job, plan, train, header),
        }

    return _decide(job).finish("megatron", RELEASE, render)
