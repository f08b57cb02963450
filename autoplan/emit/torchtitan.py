"""The plan as a torchtitan job config TOML (``torchtitan/config/job_config.py`` keys; the TOML
format of torchtitan <= 0.2, loadable with ``--job.config_file``; 0.3 moved to Python configs).

Mapping: t -> tensor_parallel_degree (torchtitan always pairs TP with sequence
parallelism), p -> pipeline_parallel_degree, schedule -> pipeline_parallel_schedule (GPipe,
1F1B, Interleaved1F1B), v -> pipeline_parallel_layers_per_stage (or module_fqns_per_model_part
for an explicit layer split), mb -> pipeline_parallel_microbatch_size, d/zero ->
data_parallel_replicate_degree (ZeRO-0/1: DDP) or data_parallel_shard_degree with
fsdp_reshard_after_forward never (ZeRO-2) / always (ZeRO-3), hsdp -> data_parallel_shard_degree
= hsdp and data_parallel_replicate_degree = d / hsdp (torchtitan's HSDP), offload=cpu ->
enable_cpu_offload, ckpt -> activation_checkpoint.mode. Mismatches are stated in comments.
"""

from __future__ import annotations

from typing import Any

from autoplan.runtime.config import TrainSettings
from simulator.job import Job

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dp(job: Job, notes: list[str]) -> dict[str, Any]:
    plan = job.plan
    if plan.zero >= 2:
        return {  # hybrid sharding (hsdp): shard over hsdp ranks, replicate over d / hsdp
            "data_parallel_replicate_degree": plan.replicas,
            "data_parallel_shard_degree": plan.shard_group,
            "fsdp_reshard_after_forward": "always" if plan.zero == 3 else "never",
        }
    if plan.d > 1 and (plan.t > 1 or plan.p > 1):
        notes.append(
            f"zero={plan.zero} with TP/PP: torchtitan's DDP is 1-D only, so this uses FSDP without "
            "resharding after forward (ZeRO-2 memory)"
        )
        return {
            "data_parallel_replicate_degree": 1,
            "data_parallel_shard_degree": plan.d,
            "fsdp_reshard_after_forward": "never",
        }
    if plan.zero == 1 and plan.d > 1:
        notes.append("zero=1: torchtitan has no optimizer-only sharding; this is plain DDP (ZeRO-0 memory)")
    return {
        "data_parallel_replicate_degree": plan.d,
        "data_parallel_shard_degree": 1,
        "fsdp_reshard_after_forward": "default",
    }


def _pipeline(job: Job, notes: list[str]) -> dict[str, Any]:
    plan, m = job.plan, job.model
    out: dict[str, Any] = {
        "pipeline_parallel_degree": plan.p,
        "pipeline_parallel_schedule": SCHEDULES[plan.schedule],
        "pipeline_parallel_microbatch_size": plan.mb,
    }
    sizes = plan.chunk_layers(m.num_layers)
    if plan.p > 1 and len(set(sizes)) == 1:
        out["pipeline_parallel_layers_per_stage"] = sizes[0]
    elif plan.p > 1:
        parts, start = [], 0
        for i, n in enumerate(sizes):
            part = [f"layers.{j}" for j in range(start, start + n)]
            start += n
            parts.append(
                (["tok_embeddings"] if i == 0 else []) + part + (["norm", "output"] if i == len(sizes) - 1 else [])
            )
        out["module_fqns_per_model_part"] = parts
    return out


def _checkpoint(job: Job, notes: list[str]) -> dict[str, Any]:
    plan = job.plan
    if plan.recompute is not None:
        notes.append(
            f"recompute={'/'.join(f'{f}:{s}' for f, s in plan.recompute)}: torchtitan applies one mode to every layer"
        )
    if plan.ckpt == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": plan.ckpt}


def torchtitan_toml(job: Job, train: TrainSettings) -> str:
    plan, m = job.plan, job.model
    notes: list[str] = []
    if plan.t > 1 and not plan.sp:
        notes.append("sp=0: torchtitan always uses sequence parallelism with tensor parallelism")
    if plan.offload == "nvme":
        notes.append("offload=nvme: torchtitan has no NVMe offload")
    parallelism = {
        **_dp(job, notes),
        "tensor_parallel_degree": plan.t,
        **_pipeline(job, notes),
        "context_parallel_degree": 1,
    }
    sections: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": "./outputs", "description": f"autoplan: {m.name}, plan {plan.to_string()}"},
        "model": {"name": "llama3", "flavor": m.name},
        "optimizer": {
            "name": "AdamW",
            "lr": train.lr,
            "beta1": train.betas[0],
            "beta2": train.betas[1],
            "eps": train.eps,
            "weight_decay": train.weight_decay,
        },
        "training": {
            "local_batch_size": job.global_batch // plan.d,
            "global_batch_size": job.global_batch,
            "seq_len": m.seq_length,
            "max_norm": train.max_norm,
            "steps": 100,
            "mixed_precision_param": "bfloat16",
            "mixed_precision_reduce": "float32",
            "enable_cpu_offload": plan.offload == "cpu",
            "dataset": "c4_test",
        },
        "parallelism": parallelism,
        "activation_checkpoint": _checkpoint(job, notes),
    }
    lines = [
        f"# torchtitan job config for model {m.name} (h={m.hidden_size}, l={m.num_layers}, a={m.num_attention_heads}, "
        f"kv={m.kv_heads}, ffn={m.ffn}, vocab={m.vocab_size}): register a flavor with these sizes",
        f"# plan {plan.to_string()} on {plan.gpus} GPUs, global batch {job.global_batch}",
    ] + [f"# note: {n}" for n in notes]
    for name, kv in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_value(v)}" for k, v in kv.items()]
    return "\n".join(lines) + "\n"
