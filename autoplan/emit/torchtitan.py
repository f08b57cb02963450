"""The plan for torchtitan 0.3: a config module (``torchtitan_config.py``) and its launch script.

torchtitan 0.3 reads a Python function returning ``Trainer.Config`` (``--module``/``--config``,
``torchtitan/config/manager.py``); 0.2's TOML job files are gone. Mapping (``config/configs.py``,
``trainer.py``, ``distributed/pipeline_parallel.py``, ``models/llama3/parallelize.py``):

- The model: a Llama-style decoder built from torchtitan's blocks with the model file's sizes
  (dim, layers, heads, KV heads, the exact SwiGLU hidden size, vocabulary, rotary base). GPT-style
  models (GELU, LayerNorm, learned positions) are refused: torchtitan ships no such model.
- A mixture of experts: the same decoder with torchtitan's MoE layer in every block
  (``models/common/moe.py`` through ``config_utils.make_moe_config``, in ``Qwen3TransformerBlock`` /
  ``Qwen3Model`` without QK norms, parallelized by ``parallelize_qwen3``, its attention given the
  model's ``head_dim``, which ``Qwen3Model.Config.get_nparams_and_flops`` asserts at start-up,
  ``models/qwen3/model.py``): E SwiGLU experts of the model's expert FFN size, a router taking
  the softmax over the experts, the top k, renormalized
  (Mixtral's routing: ``score_func="softmax"``, ``route_norm=True``), no load-balancing bias
  (``load_balance_coeff=None``). ep -> ``expert_parallel_degree``; torchtitan's EP borrows ranks
  from dp_shard x cp x tp (``efsdp = dp_shard * cp * tp / ep``, ``distributed/parallel_dims.py``),
  so with t = 1 it is autoplan's ep over the d*cp ranks with whole experts, the expert states
  sharded over the other efsdp ranks; with t > 1 it would take the experts off the tensor ranks
  (Megatron, which autoplan prices, splits each expert over them), so t > 1 with ep > 1 is
  refused; ep = 1 with t > 1 splits the experts over the tensor ranks, as Megatron does.
- t -> ``tensor_parallel_degree``, sp -> ``enable_sequence_parallel``; p -> ``pipeline_parallel_degree``
  with the plan's split as ``module_fqns_per_model_part`` (p*v stages, rank r running r, r+p, ...:
  the looped placement autoplan plans, or for zbv rank r running r and 2p-1-r, torchtitan's "v"
  style; no ``*_less_layers`` defaults involved); schedule -> ``1F1B`` / ``GPipe`` /
  ``Interleaved1F1B`` / ``InterleavedZeroBubble`` (zbh1) / ``ZBVZeroBubble``; mb ->
  ``pipeline_parallel_microbatch_size``.
- zbh1 with one stage per rank: torch's ``ScheduleInterleavedZeroBubble`` (the ZB1P schedule,
  torch/distributed/pipelining/schedules.py) takes any number of local stages
  (``n_local_stages = len(stages)``) and with one per rank is ZB-H1 (its weight passes ``W``
  deferred p-1-r slots on rank r). torchtitan's "Multi-stage schedule requires at least 2 stages
  per rank" (``_get_pipeline_metadata``, distributed/pipeline_parallel.py) is raised only when it
  derives the stages from ``pipeline_parallel_layers_per_stage``; with ``module_fqns_per_model_part``
  of p parts ``_get_pp_rank_to_stage_indices_mapping`` gives rank r stage r and
  ``_build_pipeline_schedule`` passes it to the schedule. The schedule's ``__init__`` raises
  "Zero bubble requires the number of microbatches to be a multiple of the number of rounds"
  (rounds = max(1, m // p)): such a plan runs 1f1b.
- Batch: the trainer accumulates ``global / (local x dp)`` steps and, with a pipeline, splits
  ``local`` into ``local / mb`` microbatches; so local = mb (no pipeline: m accumulation steps)
  or mb x m (pipeline: m microbatches, one step).
- d: FSDP2 on (``data_parallel_replicate_degree``, ``data_parallel_shard_degree``): ZeRO-0 =
  replicate d; ZeRO-2 / ZeRO-3 = shard with ``fsdp_reshard_after_forward`` never / always;
  hsdp=N = shard N, replicate d/N. ZeRO-1 has no equivalent (-> ZeRO-2), nor has ZeRO-0 with
  ep > 1 (the expert ranks are data-shard ranks: -> ZeRO-2).
- cp -> ``context_parallel_degree`` (torch's ring attention over SDPA); torchtitan then shards
  the states over dp_shard x cp (its ``fsdp`` mesh), so the shard degree is the shard group / cp,
  and a plan without sharding becomes ZeRO-2 sharded over the cp ranks.
- offload=cpu -> ``enable_cpu_offload`` (FSDP2 CPUOffloadPolicy: parameters, gradients and
  optimizer state on the host). Recomputation: one mode for every layer (full, torchtitan's
  op-level selective, or none). prec=fp8 -> ``Float8LinearConverter`` over the layers' linears
  (the output layer stays bf16) with ``torch.compile`` (torchao's float8 casts fuse when compiled);
  fp8ag=1 has no equivalent (its float8 is rowwise; torchao's fp8 all-gather is tensorwise only).
"""

from __future__ import annotations

from typing import Any

from autoplan.emit.export import Draft, Export, fill_template, refuse
from autoplan.emit.launch import node_shape, rendezvous_block
from autoplan.emit.safe_text import comment_lines
from autoplan.emit.schedule import TrainingSchedule, training_schedule
from autoplan.runtime.config import TrainSettings
from simulator.job import Job
from simulator.plan import Plan

RELEASE = "torchtitan 0.3.0"
SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "zbh1": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
}


def architecture_refusal(job: Job) -> str | None:
    """Why torchtitan cannot train this model as autoplan models it, or None."""
    m = job.model
    gpt = [
        what
        for what, differs in (
            (f"{m.activation} MLP", m.activation != "swiglu"),
            ("LayerNorm", m.normalization != "RMSNorm"),
            ("learned positions", m.position_embedding_type != "rope"),
        )
        if differs
    ]
    if gpt:
        return (
            f"{m.name} is GPT-style ({', '.join(gpt)}); torchtitan 0.3 ships Llama-style decoders only "
            "(SwiGLU, RMSNorm, RoPE), a different model"
        )
    if m.num_experts and job.plan.ep > 1 and job.plan.t > 1:
        return (
            f"ep={job.plan.ep} with t={job.plan.t}: torchtitan's expert parallelism borrows the tensor ranks and keeps "
            "each expert whole (efsdp = dp_shard * cp * tp / ep, distributed/parallel_dims.py), where autoplan prices "
            "Megatron's, which splits every expert over the t ranks; plan with t=1, or ep=1"
        )
    if m.tie_embeddings and job.plan.p > 1:
        return "tied embeddings with p > 1: torchtitan raises NotImplementedError (models/common/decoder.py)"
    return None


def _recompute_draft(d: Draft) -> None:
    n = d.job.model.num_layers
    rec = d.plan().chunk_recompute(n)
    full, sel = sum(f for f, _ in rec), sum(s for _, s in rec)
    mode = "full" if full else "selective" if sel else "none"
    if d.plan().recompute is not None or (full and sel):
        d.change_recompute(mode, None, f"torchtitan applies one activation-checkpoint mode to every layer ({mode})")


def _context_draft(d: Draft) -> None:
    """torchtitan applies FSDP2 over the data-shard x context ranks whenever cp > 1
    (distributed/parallel_dims.py: "we always assume that when cp is used, FSDP is also applied
    to cp"; its mesh ``fsdp`` = dp_shard * cp): the states are sharded at least over the cp ranks,
    so ZeRO-0/1 become ZeRO-2 sharded over them (hybrid across the d replicas), and a hybrid
    shard group must be a multiple of cp."""
    plan = d.plan()
    why = "torchtitan shards the states with FSDP2 over the context-parallel ranks whenever cp > 1"
    if plan.zero < 2:
        d.change(
            "zero", 2, why + " (ZeRO-2 with its states sharded over the cp ranks)", hsdp=plan.cp if plan.d > 1 else 0
        )
    elif plan.hsdp and plan.hsdp % plan.cp:
        d.change(
            "hsdp", 0, why + f": its shard group is a multiple of cp={plan.cp}, so hsdp={plan.hsdp} cannot be kept"
        )


def _schedule_draft(d: Draft) -> None:
    """ZB-H1 runs as torch's ScheduleInterleavedZeroBubble with one stage per rank, unless its
    rounds (m // p) do not divide the m microbatches (then 1F1B)."""
    plan = d.job.plan
    rounds = max(1, d.job.m // plan.p)
    if plan.schedule == "zbh1" and d.job.m % rounds:
        d.change(
            "schedule",
            "1f1b",
            f"torch's ScheduleInterleavedZeroBubble.__init__ (torch/distributed/pipelining/schedules.py) raises "
            f"'Zero bubble requires the number of microbatches to be a multiple of the number of rounds' "
            f"({d.job.m} microbatches, {rounds} rounds = m // p)",
        )


def _sharding_draft(d: Draft) -> None:
    """The ZeRO stage torchtitan's FSDP2 meshes can run: ZeRO-1 has no equivalent (ZeRO-2, or
    replicated under a zero-bubble schedule), nor has ZeRO-0 with expert parallelism (ZeRO-2)."""
    plan = d.plan()  # its schedule as _schedule_draft left it
    if plan.zero == 1 and plan.schedule in ("zbh1", "zbv"):
        d.change(
            "zero",
            0,
            f"torchtitan has no optimizer-only sharding, and {plan.schedule} with sharded gradients (its ZeRO-2) is "
            "not modelled: the states replicated (FSDP2 replicate)",
            hsdp=0,
        )
    elif plan.zero == 1:
        d.change(
            "zero", 2, "torchtitan has no optimizer-only sharding; FSDP2 without resharding after forward is ZeRO-2"
        )
    elif plan.zero == 0 and plan.ep > 1:
        d.change(
            "zero",
            2,
            "torchtitan's expert-parallel ranks are data-shard ranks (efsdp x ep = dp_shard x cp x tp): "
            "FSDP2 without resharding after forward is ZeRO-2",
        )


def _feature_draft(d: Draft) -> None:
    """The plan's features torchtitan 0.3 lacks (NVMe offload, fp8 all-gather) replaced, and its
    own fp8 recipe named."""
    plan = d.job.plan
    if plan.offload == "nvme":
        d.change("offload", "cpu", "torchtitan has no NVMe offload")
    if plan.fp8ag:
        d.change(
            "fp8ag",
            0,
            "torchtitan 0.3's float8 converter has rowwise scaling only, and torchao's float8 all-gather for FSDP "
            "needs tensorwise scaling (torchao/float8/config.py: 'enable_fsdp_float8_all_gather only supports "
            "tensorwise scaling granularity')",
        )
    if plan.prec == "fp8":
        d.notes.append(
            "prec=fp8: torchtitan's Float8LinearConverter (torchao float8, rowwise dynamic scaling) under "
            "torch.compile; autoplan prices Transformer Engine's recipe (delayed scaling, fused casts)"
        )


def _written_plan_notes(d: Draft) -> None:
    """Notes on what the written plan runs differently from autoplan's model of it, and the tokenizer."""
    job = d.job
    written = d.plan()
    if written.offload == "cpu" and written.zero < 3:
        d.notes.append("offload=cpu: FSDP2's CPU offload moves the parameters to the host too (the plan keeps them)")
    if written.ckpt == "selective":
        d.notes.append(
            "ckpt=selective: torchtitan's selective AC is op-level (keeps matmul outputs, recomputes the rest), "
            "not the attention-core recomputation autoplan models"
        )
    if job.model.num_experts:
        d.notes.append(
            f"mixture of experts: torchtitan's MoE layer (top-{job.model.moe_router_topk} of {job.model.num_experts} "
            "experts, softmax router renormalized over the top k, no load-balancing loss or bias); autoplan prices "
            f"Megatron-core's all-to-all dispatcher with moe_load_imbalance={job.model.moe_load_imbalance}"
        )
    if job.model.attention == "materialized":
        d.notes.append("attention=materialized: torchtitan runs FlexAttention (fused, no s x s scores kept)")
    d.notes.append(
        "torchtitan_launch.sh needs TOKENIZER (a tokenizer whose vocabulary is the model's) and DATASET, or MOCK_DATA=1 "
        "for torchtitan's c4_test sample"
    )


def _decide(job: Job) -> Draft:
    """torchtitan's closest plan to the job's (schedule, sharding, context, features, recomputation) and its notes."""
    d = Draft(job)
    _schedule_draft(d)
    _sharding_draft(d)
    if job.plan.cp > 1:
        _context_draft(d)
    _feature_draft(d)
    _recompute_draft(d)
    _written_plan_notes(d)
    return d


def _fqns(job: Job, plan: Plan) -> list[list[str]]:
    """Module names of each pipeline stage (torchtitan's llama3: tok_embeddings, layers.i, norm, lm_head)."""
    sizes = plan.chunk_layers(job.model.num_layers)
    parts, start = [], 0
    for i, n in enumerate(sizes):
        names = [f"layers.{j}" for j in range(start, start + n)]
        start += n
        parts.append(
            (["tok_embeddings"] if i == 0 else []) + names + (["norm", "lm_head"] if i == len(sizes) - 1 else [])
        )
    return parts


def parallelism(job: Job, plan: Plan) -> dict[str, Any]:
    """``ParallelismConfig`` fields for ``plan``."""
    out: dict[str, Any] = {
        "tensor_parallel_degree": plan.t,
        "enable_sequence_parallel": bool(plan.sp),
        "pipeline_parallel_degree": plan.p,
        "pipeline_parallel_schedule": SCHEDULES[plan.schedule],
        "pipeline_parallel_microbatch_size": plan.mb,
        "context_parallel_degree": plan.cp,
        "expert_parallel_degree": plan.ep,
    }
    if plan.zero >= 2:
        out |= {
            "data_parallel_replicate_degree": plan.replicas,
            "data_parallel_shard_degree": plan.shard_group // plan.cp,
            "fsdp_reshard_after_forward": "always" if plan.zero == 3 else "never",
        }
    else:
        out |= {"data_parallel_replicate_degree": plan.d, "data_parallel_shard_degree": 1}
    if plan.p > 1:
        out["module_fqns_per_model_part"] = _fqns(job, plan)
    return out


def training(job: Job, plan: Plan, train: TrainSettings, schedule: TrainingSchedule) -> dict[str, Any]:
    """``TrainingConfig`` fields for ``plan`` (its steps: the schedule's iterations)."""
    return {
        "local_batch_size": plan.mb * (job.m if plan.p > 1 else 1),
        "global_batch_size": job.global_batch,
        "seq_len": job.model.seq_length,
        "steps": schedule.train_iters,
        "max_norm": train.max_norm,
        "enable_cpu_offload": plan.offload == "cpu",
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
        # Trainer.Config._validate_cuda_graphs: "CUDA graphs do not support pipeline parallelism yet", nor the
        # all-to-all token dispatcher's host synchronization under expert parallelism
        "disable_cuda_graphs": plan.p > 1 or plan.ep > 1,
    }


def torchtitan_config(job: Job, plan: Plan, train: TrainSettings, schedule: TrainingSchedule, header: list[str]) -> str:
    m = job.model
    model = {
        "name": m.name,
        "dim": m.hidden_size,
        "n_layers": m.num_layers,
        "n_heads": m.num_attention_heads,
        "n_kv_heads": m.kv_heads,
        "head_dim": m.head_dim,  # hidden_size / heads: the rotary size, and the Qwen3 decoder's attention head_dim
        "ffn_hidden_dim": m.ffn,
        "vocab_size": m.vocab_size,
        "rope_theta": m.rope_theta,
        "max_seq_len": m.seq_length,
        "tie_embeddings": m.tie_embeddings,
        "num_experts": m.num_experts or 0,  # 0: dense
        "top_k": m.moe_router_topk if m.num_experts else 0,
    }
    optimizer = {"lr": schedule.lr, "betas": tuple(train.betas), "eps": train.eps, "weight_decay": train.weight_decay}
    lr_schedule = {  # warm-up, then the cosine to min_lr over the decay iterations (autoplan.emit.schedule)
        "warmup_steps": schedule.warmup_iters,
        "total_steps": schedule.decay_iters,
        "decay_type": "cosine",
        "min_lr_factor": schedule.min_lr_share,
    }
    values = {
        "MODEL: dict[str, Any]": repr(model),
        "PARALLELISM: dict[str, Any]": repr(parallelism(job, plan)),
        "TRAINING: dict[str, Any]": repr(training(job, plan, train, schedule)),
        "OPTIMIZER: dict[str, Any]": repr(optimizer),
        "LR_SCHEDULE: dict[str, Any]": repr(lr_schedule),
        "ACTIVATION_CHECKPOINT": repr(plan.ckpt),
        "FLOAT8": repr(plan.prec == "fp8"),
    }
    return fill_template("torchtitan_config.py", values, header)


def torchtitan_launch(job: Job, schedule: TrainingSchedule, header: list[str]) -> str:
    """torchtitan_launch.sh: the job's data and tokenizer (DATASET, DATASET_PATH, TOKENIZER; or
    MOCK_DATA=1 for torchtitan's bundled c4_test sample, a smoke test), its length and output
    folder (checkpoints and TensorBoard logs under OUTPUT_DIR), then torchrun torchtitan.train."""
    nodes, per_node = node_shape(job)
    return f"""#!/usr/bin/env bash
{comment_lines(header)}
# usage: DATASET=<a dataset torchtitan knows, e.g. c4> [DATASET_PATH=<its local copy>] TOKENIZER=<HF tokenizer dir>
#        bash torchtitan_launch.sh [more torchtitan overrides]
#   MOCK_DATA=1 trains on torchtitan's bundled c4_test sample instead (a smoke test; TOKENIZER still needed).
#   TRAIN_ITERS, SAVE_INTERVAL and OUTPUT_DIR (default: $RUN_DIR/outputs: checkpoint/ and tb/, resumed from) change the rest.
# multi-node: NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, RDZV_ID as for launch.sh
set -euo pipefail
RUN_DIR="$(cd -- "$(dirname -- "${{BASH_SOURCE[0]}}")" && pwd)"
NNODES="${{NNODES:-{nodes}}}"
NODE_RANK="${{NODE_RANK:-0}}"
NPROC_PER_NODE="${{NPROC_PER_NODE:-{per_node}}}"
{rendezvous_block()}
: "${{TOKENIZER:?set TOKENIZER to the directory of the Hugging Face tokenizer of your data (the --hf_assets_path of torchtitan)}}"
if [ "${{MOCK_DATA:-0}}" = 1 ]; then  # a smoke test on the bundled sample
  DATA=(--dataloader.dataset c4_test)
else
  : "${{DATASET:?set DATASET to a dataset torchtitan knows (c4, or one registered in torchtitan.hf_datasets; MOCK_DATA=1 runs a smoke test)}}"
  DATA=(--dataloader.dataset "$DATASET")
  if [ -n "${{DATASET_PATH:-}}" ]; then DATA+=(--dataloader.dataset_path "$DATASET_PATH"); fi
fi
JOB=(--hf_assets_path "$TOKENIZER" --dump_folder "${{OUTPUT_DIR:-$RUN_DIR/outputs}}"
     --training.steps "${{TRAIN_ITERS:-{schedule.train_iters}}}" --checkpoint.interval "${{SAVE_INTERVAL:-1000}}")
export PYTHONPATH="$RUN_DIR${{PYTHONPATH:+:$PYTHONPATH}}"
exec torchrun "${{RDZV[@]}}" --nproc-per-node "$NPROC_PER_NODE" -m torchtitan.train \\
  --module torchtitan_config --config autoplan_config "${{DATA[@]}}" "${{JOB[@]}}" "$@"
"""


def export_torchtitan(job: Job, train: TrainSettings) -> Export:
    why = architecture_refusal(job)
    if why:
        return refuse("torchtitan", RELEASE, why)

    schedule = training_schedule(job.model, job.global_batch, train)

    def render(plan: Plan, header: list[str]) -> dict[str, str]:
        return {
            "torchtitan_config.py": torchtitan_config(job, plan, train, schedule, header),
            "torchtitan_launch.sh": torchtitan_launch(job, schedule, header),
        }

    return _decide(job).finish("torchtitan", RELEASE, render)
