"""Writes a run dir: plan.json, launch.sh, slurm.sbatch, Megatron-LM / DeepSpeed / torchtitan configs."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from autoplan import __version__
from autoplan.emit.deepspeed import deepspeed_config
from autoplan.emit.launch import launch_sh, slurm_sbatch
from autoplan.emit.megatron import megatron_args_text
from autoplan.emit.torchtitan import torchtitan_toml
from autoplan.outputs import check_run_dir
from autoplan.runtime.config import PLAN_FILE, RunSpec, TrainSettings, run_spec_to_dict
from hwprofiles.errors import InputError
from simulator.job import Job

log = logging.getLogger(__name__)


def plan_json(job: Job, prediction: dict[str, Any], train: TrainSettings) -> dict[str, Any]:
    """Model, plan, batch, training settings, the target cluster and the predicted metrics."""
    spec = RunSpec(model=job.model, plan=job.plan, global_batch=job.global_batch, train=train)
    c = job.cluster
    gpu = c.node.gpu if isinstance(c.node.gpu, str) else c.node.gpu.name
    return {
        "autoplan_version": __version__,
        **run_spec_to_dict(spec),
        "cluster": {
            "name": c.name,
            "nodes": c.nodes,
            "gpus_per_node": c.gpus_per_node,
            "gpu": gpu,
            "backend": c.node.backend,
        },
        "prediction": prediction,
    }


def write_run_dir(
    job: Job, prediction: dict[str, Any], out_dir: Path, train: TrainSettings | None = None, force: bool = False
) -> list[Path]:
    """Write every run-dir file into ``out_dir`` (created if needed; a folder that holds files
    only with ``force``: :func:`autoplan.outputs.check_run_dir`); return the paths written."""
    train = train or TrainSettings()
    out_dir = Path(out_dir)
    if check_run_dir(out_dir, force):
        log.warning("autoplan emit: --force: replacing the emitted files in %s (other files are kept)", out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"-o {out_dir}: cannot create directory: {e.strerror}") from None
    files: dict[str, str] = {
        PLAN_FILE: json.dumps(plan_json(job, prediction, train), indent=2) + "\n",
        "launch.sh": launch_sh(job),
        "slurm.sbatch": slurm_sbatch(job, str(out_dir.resolve())),
        "megatron_args.txt": megatron_args_text(job, train),
        "deepspeed_config.json": json.dumps(deepspeed_config(job, train), indent=2) + "\n",
        "torchtitan.toml": torchtitan_toml(job, train),
    }
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text)
        if name.endswith((".sh", ".sbatch")):
            os.chmod(path, 0o755)
        written.append(path)
    return written
