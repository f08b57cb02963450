"""``launch.sh`` (torchrun, single- or multi-node) and ``slurm.sbatch`` for a run dir.

launch.sh reads its topology from the environment: NNODES, NODE_RANK, NPROC_PER_NODE,
MASTER_ADDR, MASTER_PORT (the c10d rendezvous endpoint), RDZV_ID and PYTHON. Extra
arguments go to the program (after ``--``, so torchrun cannot take them for its own).
"""

from __future__ import annotations

from autoplan.emit.safe_text import comment_lines, shell_word, slurm_word
from simulator.job import Job


def node_shape(job: Job) -> tuple[int, int]:
    """(nodes, processes per node) for the plan's t*p*d ranks on the job's cluster."""
    world = job.plan.gpus
    per_node = min(world, job.cluster.gpus_per_node)
    return -(-world // per_node), per_node


def rendezvous_block() -> str:
    """Bash that sets RDZV, torchrun's rendezvous arguments: standalone on one node, else c10d at
    MASTER_ADDR:MASTER_PORT (NNODES and NODE_RANK must be set before it)."""
    return """if [ "$NNODES" -eq 1 ]; then
  RDZV=(--standalone --nnodes 1)
else
  RDZV=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --rdzv-backend c10d
        --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}:${MASTER_PORT:-29500}"
        --rdzv-id "${RDZV_ID:-autoplan}")
fi"""


def launch_sh(job: Job) -> str:
    """launch.sh: torchrun of autoplan's program on the plan's ranks (input text only in its
    header, through :func:`autoplan.emit.safe_text.comment_lines`)."""
    nodes, per_node = node_shape(job)
    world = job.plan.gpus
    header = comment_lines(
        [
            f"autoplan run dir: model {job.model.name}, plan {job.plan.to_string()}, global batch {job.global_batch}",
            f"{world} ranks = {nodes} node(s) x {per_node} per node (cluster {job.cluster.name}).",
        ]
    )
    return f"""#!/usr/bin/env bash
{header}
#
# single node:  bash launch.sh [--steps K] [--check-steps C] [--device cpu|cuda]
# multi-node:   on node i of N:  NNODES=N NODE_RANK=i MASTER_ADDR=<node 0 address> MASTER_PORT=29500 bash launch.sh
# environment:  NNODES, NODE_RANK, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT, RDZV_ID, PYTHON
set -euo pipefail
RUN_DIR="$(cd -- "$(dirname -- "${{BASH_SOURCE[0]}}")" && pwd)"
PYTHON="${{PYTHON:-python3}}"
NNODES="${{NNODES:-{nodes}}}"
NODE_RANK="${{NODE_RANK:-0}}"
NPROC_PER_NODE="${{NPROC_PER_NODE:-{per_node}}}"
WORLD={world}
if [ "$((NNODES * NPROC_PER_NODE))" -ne "$WORLD" ]; then
  echo "launch.sh: NNODES*NPROC_PER_NODE = $((NNODES * NPROC_PER_NODE)) but the plan needs t*p*d = $WORLD ranks" >&2
  exit 2
fi
{rendezvous_block()}
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-1}}"
exec "$PYTHON" -m torch.distributed.run "${{RDZV[@]}}" --nproc-per-node "$NPROC_PER_NODE" --max-restarts 0 \\
  -m autoplan.runtime.train -- --run-dir "$RUN_DIR" "$@"
"""


def slurm_sbatch(job: Job, run_dir: str) -> str:
    """slurm.sbatch: one launch.sh per node under srun; ``run_dir`` (the ``-o`` folder) is RUN_DIR's
    default. Input text goes through :mod:`autoplan.emit.safe_text`: the header as a comment, the
    job name as an ``#SBATCH`` value, the run dir as one shell word."""
    nodes, per_node = node_shape(job)
    gpu = job.cluster.node.backend == "nccl"
    gres = f"#SBATCH --gpus-per-node={per_node}\n" if gpu else ""
    header = comment_lines(
        [f"autoplan: model {job.model.name}, plan {job.plan.to_string()}, global batch {job.global_batch}"]
    )
    return f"""#!/bin/bash
{header}
# submit with:  sbatch slurm.sbatch [program args, e.g. --steps 20]
#SBATCH --job-name=autoplan-{slurm_word(job.model.name)}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{gres}#SBATCH --exclusive
#SBATCH --time=01:00:00
#SBATCH --output=%x-%j.out
set -euo pipefail
EMITTED_TO={shell_word(run_dir, "-o")}
export RUN_DIR="${{RUN_DIR:-$EMITTED_TO}}"
export NNODES="$SLURM_NNODES"
export NPROC_PER_NODE={per_node}
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_PORT="${{MASTER_PORT:-29500}}"
export RDZV_ID="$SLURM_JOB_ID"
srun --ntasks-per-node=1 bash -c 'NODE_RANK="$SLURM_NODEID" exec bash "$RUN_DIR/launch.sh" "$@"' launch "$@"
"""
