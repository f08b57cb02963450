"""megatron_launch.sh: how a node starts Megatron-LM on the plan (autoplan.emit.megatron writes the
arguments it reads): the environment Megatron-LM checks, the job's data and tokenizer (or the mock
dataset, an explicit smoke test), its length, checkpoints and logs, then torchrun pretrain_gpt.py."""

from __future__ import annotations

from autoplan.emit.launch import node_shape, rendezvous_block
from autoplan.emit.safe_text import comment_lines
from autoplan.emit.schedule import TrainingSchedule, training_schedule
from autoplan.runtime.config import TrainSettings
from simulator.job import Job
from simulator.plan import Plan


def megatron_env(plan: Plan) -> dict[str, str | None]:
    """Environment the launch exports (None: unset), as Megatron-LM's ``validate_args``
    (megatron/training/arguments.py) checks CUDA_DEVICE_MAX_CONNECTIONS:

    - ``if (args.tensor_model_parallel_size > 1 or args.context_parallel_size > 1) and
      get_device_arch_version() < 10`` it asserts the value is "1" ("Using tensor model parallelism
      or context parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS
      to 1"), except with Torch-FSDP2 / Megatron-FSDP or ``--overlap-moe-expert-parallel-comm``
      (not emitted), where it only warns; from Blackwell (arch 10) on nothing is asserted, and "1"
      is accepted there too, so t > 1 or cp > 1 exports it whatever the GPU;
    - under ``--use-megatron-fsdp`` (ZeRO-2/3 here) it asserts the value is not "1" ("FSDP requires
      CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."), so it is unset."""
    if plan.zero >= 2:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1" if plan.t > 1 or plan.cp > 1 else None}


def megatron_launch(job: Job, plan: Plan, train: TrainSettings, header: list[str]) -> str:
    """megatron_launch.sh: exports the environment Megatron checks, sets the job's data, length,
    checkpoints and logs (:func:`job_block`), then runs torchrun pretrain_gpt.py."""
    nodes, per_node = node_shape(job)
    env = []
    for key, value in megatron_env(plan).items():
        env.append(f"export {key}={value}" if value is not None else f"unset {key}")
    return f"""#!/usr/bin/env bash
{comment_lines(header)}
# usage: MEGATRON_LM=<Megatron-LM checkout> DATA_PATH=<prefix, or "weight prefix ..."> TOKENIZER=<HF tokenizer>
#        bash megatron_launch.sh [more pretrain_gpt.py arguments]
#   DATA_PATH: the data files tools/preprocess_data.py wrote (Megatron's --data-path); TOKENIZER: the Hugging Face
#   tokenizer (name or directory) they were made with; MOCK_DATA=1 instead runs on random tokens (a smoke test).
#   CHECKPOINT_DIR (default: $RUN_DIR/checkpoints; resumed from when it holds one), SAVE_INTERVAL, TRAIN_ITERS,
#   TENSORBOARD_DIR (default: $RUN_DIR/tensorboard) change the rest.
# multi-node: NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, RDZV_ID as for launch.sh
set -euo pipefail
RUN_DIR="$(cd -- "$(dirname -- "${{BASH_SOURCE[0]}}")" && pwd)"
: "${{MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (the directory of pretrain_gpt.py)}}"
NNODES="${{NNODES:-{nodes}}}"
NODE_RANK="${{NODE_RANK:-0}}"
NPROC_PER_NODE="${{NPROC_PER_NODE:-{per_node}}}"
{rendezvous_block()}
{chr(10).join(env)}
{job_block(job, training_schedule(job.model, job.global_batch, train))}
mapfile -t ARGS < <(grep -v '^#' "$RUN_DIR/megatron_args.txt" | xargs -n 1)
exec torchrun "${{RDZV[@]}}" --nproc-per-node "$NPROC_PER_NODE" "$MEGATRON_LM/pretrain_gpt.py" "${{ARGS[@]}}" \\
  "${{DATA[@]}}" "${{JOB[@]}}" "$@"
"""


#: Megatron's train/validation/test split of the data (--split): a percent held out for validation
DATA_SPLIT = "99,1,0"


def job_block(job: Job, schedule: TrainingSchedule) -> str:
    """The launcher's job settings, one place to set them: the data and tokenizer (DATA_PATH and
    TOKENIZER, or MOCK_DATA=1 for Megatron's mock dataset and NullTokenizer; neither is a
    one-line error), the length (TRAIN_ITERS, default the schedule's), the checkpoints
    (``--save``/``--load`` CHECKPOINT_DIR every SAVE_INTERVAL iterations) and TensorBoard."""
    vocab = job.model.vocab_size
    return f"""if [ "${{MOCK_DATA:-0}}" = 1 ]; then  # a smoke test: random tokens, no tokenizer
  DATA=(--mock-data --tokenizer-type NullTokenizer --vocab-size {vocab})
else
  : "${{DATA_PATH:?set DATA_PATH to your data (the --data-path of Megatron-LM; MOCK_DATA=1 runs a smoke test on random tokens)}}"
  : "${{TOKENIZER:?set TOKENIZER to the Hugging Face tokenizer your data was made with}}"
  read -r -a DATA_PREFIXES <<< "$DATA_PATH"
  DATA=(--data-path "${{DATA_PREFIXES[@]}}" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER" --split {DATA_SPLIT})
fi
CHECKPOINT_DIR="${{CHECKPOINT_DIR:-$RUN_DIR/checkpoints}}"
JOB=(--train-iters "${{TRAIN_ITERS:-{schedule.train_iters}}}" --save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR"
     --save-interval "${{SAVE_INTERVAL:-1000}}" --tensorboard-dir "${{TENSORBOARD_DIR:-$RUN_DIR/tensorboard}}")"""
