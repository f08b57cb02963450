"""The plan as Megatron-LM ``pretrain_gpt.py`` arguments.

Mapping: t -> --tensor-model-parallel-size, p -> --pipeline-model-parallel-size, the data
parallel size is what remains of the world size; interleaved v -> --num-layers-per-virtual-
pipeline-stage; an explicit layer split -> --pipeline-model-parallel-layout; sp -> --sequence-
parallel; ZeRO-1 -> --use-distributed-optimizer; ZeRO-2/3 -> Megatron-FSDP with
--data-parallel-sharding-strategy optim_grads / optim_grads_params; offload=cpu ->
--optimizer-cpu-offload; recompute -> --recompute-granularity/-method/-num-layers. What
Megatron-LM cannot express (GPipe, NVMe offload, per-chunk recompute counts) is stated in a
comment line of the file.
"""

from __future__ import annotations

from autoplan.emit.launch import node_shape
from autoplan.runtime.config import TrainSettings
from simulator.job import Job


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
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        str(m.vocab_size),
        "--mock-data",
    ]
    if m.kv_heads != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.activation == "swiglu":
        args.append("--swiglu")
    if m.normalization == "RMSNorm":
        args.append("--disable-bias-linear")
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args


def _layout(job: Job) -> str:
    """Megatron's pipeline layout string: one '|'-separated segment per (virtual) stage."""
    sizes = job.plan.chunk_layers(job.model.num_layers)
    parts = ["t" * n for n in sizes]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "L"
    return "|".join(parts)


def _parallel_args(job: Job, notes: list[str]) -> list[str]:
    plan, m = job.plan, job.model
    args = ["--tensor-model-parallel-size", str(plan.t), "--pipeline-model-parallel-size", str(plan.p)]
    uniform = plan.layers is None or len(set(plan.layers)) == 1
    if not uniform:
        args += ["--pipeline-model-parallel-layout", _layout(job)]
    elif plan.v > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(m.num_layers // (plan.p * plan.v))]
    if plan.p > 1 and plan.schedule == "gpipe":
        notes.append(
            "schedule=gpipe: Megatron-LM has no GPipe schedule; it runs 1F1B (same bubble, less activation memory)"
        )
    if plan.sp:
        args.append("--sequence-parallel")
    args += ["--micro-batch-size", str(plan.mb), "--global-batch-size", str(job.global_batch)]
    if plan.zero == 1:
        args.append("--use-distributed-optimizer")
    elif plan.zero >= 2:
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        args += [
            "--use-distributed-optimizer",
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy",
            strategy,
            "--no-gradient-accumulation-fusion",
            "--ckpt-format",
            "fsdp_dtensor",
        ]
    if plan.hsdp:
        notes.append(f"hsdp={plan.hsdp}: not expressed; Megatron-FSDP here shards over all d={plan.d} ranks")
    if plan.offload == "cpu":
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"]
    elif plan.offload == "nvme":
        notes.append("offload=nvme: Megatron-LM has no NVMe offload (use the DeepSpeed config)")
    return args


def _recompute_args(job: Job, notes: list[str]) -> list[str]:
    plan = job.plan
    per_chunk = plan.chunk_recompute(job.model.num_layers)
    full = max(f for f, _ in per_chunk)
    sel = max(s for _, s in per_chunk)
    if plan.recompute is not None and len(set(per_chunk)) > 1:
        notes.append(
            f"recompute={'/'.join(f'{f}:{s}' for f, s in per_chunk)}: Megatron-LM applies one count to every stage"
        )
    if full:
        return [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "block" if plan.recompute else "uniform",
            "--recompute-num-layers",
            str(full if plan.recompute else 1),
        ]
    if sel:
        return ["--recompute-granularity", "selective"]
    return []


def _train_args(train: TrainSettings) -> list[str]:
    return [
        "--bf16",
        "--optimizer",
        "adam",
        "--lr",
        str(train.lr),
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
        "--train-iters",
        "100",
        "--log-interval",
        "1",
    ]


def megatron_args(job: Job, train: TrainSettings) -> tuple[list[str], list[str]]:
    """(argument list for pretrain_gpt.py, notes on what could not be expressed)."""
    notes: list[str] = []
    args = _model_args(job) + _parallel_args(job, notes) + _recompute_args(job, notes) + _train_args(train)
    return args, notes


def megatron_args_text(job: Job, train: TrainSettings) -> str:
    """The arguments one per line (flag and its value), with '#' comment lines; read with
    ``shlex.split(text, comments=True)`` or ``grep -v '^#' megatron_args.txt | xargs``."""
    args, notes = megatron_args(job, train)
    world = job.plan.gpus
    nodes, per_node = node_shape(job)
    lines = [
        f"# Megatron-LM pretrain_gpt.py arguments for model {job.model.name}, plan {job.plan.to_string()}",
        f"# launch on {world} GPUs (data-parallel size = {world} / (t*p) = {job.plan.d}), e.g. on each of {nodes} node(s):",
        f"#   torchrun --nnodes {nodes} --nproc-per-node {per_node} ... pretrain_gpt.py $(grep -v '^#' megatron_args.txt)",
    ] + [f"# note: {n}" for n in notes]
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            lines.append(args[i])
            i += 1
    return "\n".join(lines) + "\n"
