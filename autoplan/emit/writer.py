"""Writes a run dir: plan.json and, per target, the files of its exporter (:mod:`autoplan.emit.export`)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan import __version__
from autoplan.emit.deepspeed import export_deepspeed
from autoplan.emit.export import TARGETS, Export, Target
from autoplan.emit.launch import launch_sh, slurm_sbatch
from autoplan.emit.megatron import export_megatron
from autoplan.emit.torchtitan import export_torchtitan
from autoplan.outputs import check_run_dir
from autoplan.runtime.config import PLAN_FILE, RunSpec, TrainSettings, run_spec_to_dict
from hwprofiles.errors import InputError
from simulator.job import Job

if TYPE_CHECKING:
    from simulator.result import SimResult

log = logging.getLogger(__name__)
TORCH_RELEASE = "autoplan's torch.distributed program"


def export_torch(job: Job, run_dir: Path) -> Export:
    files = {"launch.sh": launch_sh(job), "slurm.sbatch": slurm_sbatch(job, str(run_dir.resolve()))}
    return Export("torch", TORCH_RELEASE, files, job.plan)


#: every file name an exporter writes (tests/test_output_paths.py checks the exports against it):
#: what ``--force`` may remove where the previous plan.json lists it (:func:`_remove_stale`)
EMITTED_FILES = frozenset(
    {
        "launch.sh",
        "slurm.sbatch",
        "megatron_args.txt",
        "megatron_launch.sh",
        "ds_config.json",
        "deepspeed_setup.py",
        "torchtitan_config.py",
        "torchtitan_launch.sh",
    }
)

EXPORTERS: dict[Target, Callable[[Job, TrainSettings, Path], Export]] = {
    "torch": lambda job, train, out: export_torch(job, out),
    "megatron": lambda job, train, out: export_megatron(job, train),
    "deepspeed": lambda job, train, out: export_deepspeed(job, train),
    "torchtitan": lambda job, train, out: export_torchtitan(job, train),
}


def export_record(export: Export, job: Job) -> dict[str, Any]:
    """plan.json's account of one target: its release, files, the plan it runs and every difference."""
    out: dict[str, Any] = {"release": export.release, "files": sorted(export.files)}
    if export.refused:
        out["refused"] = export.refused
        return out
    assert export.written is not None
    out["exact"] = export.exact
    out["runs"] = export.written.to_string()
    out["changes"] = [c.describe() for c in export.changes]
    out["notes"] = list(export.notes)
    return out


def plan_json(job: Job, prediction: dict[str, Any], train: TrainSettings, exports: Iterable[Export]) -> dict[str, Any]:
    """Model, plan, batch, training settings, the target cluster, the predicted metrics and what
    each exporter wrote."""
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
        "exports": {e.target: export_record(e, job) for e in exports},
    }


def written_estimate(export: Export, job: Job) -> SimResult | None:
    """The analytic estimate of the plan ``export``'s files run, as ``job``'s runtime (its
    framework's) runs it; None when nothing was written."""
    from simulator.analytic import estimate

    return None if export.written is None else estimate(replace(job, plan=export.written))


def export_summary(export: Export, job: Job, written: SimResult | None) -> list[str]:
    """What ``autoplan emit`` prints for one target: its files and how they relate to the plan; a
    closest plan comes with its own analytic prediction, the plan as given with one when it does
    not fit. ``written``: :func:`written_estimate`."""
    head = f"{export.target:<11}"
    if export.refused:
        return [f"{head}not written ({export.release}): {export.refused}"]
    assert export.written is not None and written is not None
    files = ", ".join(export.files)
    if export.exact:
        lines = [f"{head}{files} ({export.release}): the plan as given"]
        lines += _no_fit_line(export.target, written)
    else:
        from simulator.analytic import estimate

        lines = [f"{head}{files} ({export.release}): NOT the plan as given; it runs {export.written.to_string()}"]
        lines += [f"{'':11}  changed {c.describe()}" for c in export.changes]
        mine, planned = written, estimate(job)
        fits = "fits" if mine.fits else "does NOT fit"
        lines.append(
            f"{'':11}  predicted (analytic): {mine.step_time:.2f} s/step, {mine.peak_memory / 2**30:.1f} GiB per GPU, "
            f"{fits} in {mine.memory_capacity / 2**30:.0f} GiB (the plan: {planned.step_time:.2f} s, "
            f"{planned.peak_memory / 2**30:.1f} GiB)"
        )
    lines += [f"{'':11}note: {n}" for n in export.notes]
    return lines


def _no_fit_line(target: Target, found: SimResult) -> list[str]:
    """The prediction line of a plan as given that does not fit (``found``: its estimate as
    ``target``'s framework runs it); none when it fits."""
    if found.fits:
        return []
    why = " (it keeps fp32 parameters and gradients: simulator.cost.state_bytes.program_state_bytes)"
    return [
        f"{'':11}  predicted (analytic): {found.peak_memory / 2**30:.1f} GiB per GPU, does NOT fit in "
        f"{found.memory_capacity / 2**30:.0f} GiB{why if target == 'torch' else ''}"
    ]


def build_exports(job: Job, out_dir: Path, train: TrainSettings, targets: Iterable[Target] = TARGETS) -> list[Export]:
    """Each chosen target's export, in the order of :data:`TARGETS`."""
    chosen = set(targets)
    return [EXPORTERS[t](job, train, Path(out_dir)) for t in TARGETS if t in chosen]


def write_run_dir(
    job: Job,
    prediction: dict[str, Any],
    out_dir: Path,
    train: TrainSettings | None = None,
    force: bool = False,
    targets: Iterable[Target] = TARGETS,
    exports: list[Export] | None = None,
) -> list[Path]:
    """Write plan.json and each target's files (``exports``, or :func:`build_exports` of ``targets``)
    into ``out_dir`` (created if needed; a folder that holds files only with ``force``:
    :func:`autoplan.outputs.check_run_dir`); return the paths written."""
    train = train or TrainSettings()
    out_dir = Path(out_dir)
    if check_run_dir(out_dir, force):
        log.warning("autoplan emit: --force: replacing the emitted files in %s (other files are kept)", out_dir)
    if exports is None:
        exports = build_exports(job, out_dir, train, targets)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"-o {out_dir}: cannot create directory: {e.strerror}") from None
    files: dict[str, str] = {PLAN_FILE: json.dumps(plan_json(job, prediction, train, exports), indent=2) + "\n"}
    for export in exports:
        files.update(export.files)
    if force:
        _remove_stale(out_dir, set(files))
    written = []
    for name, text in files.items():
        path = out_dir / name
        if path.is_symlink():  # --force replaces the link itself, never the file it points to
            path.unlink()
        path.write_text(text)
        if name.endswith((".sh", ".sbatch")):
            os.chmod(path, 0o755)
        written.append(path)
    return written


def _remove_stale(out_dir: Path, writing: set[str]) -> None:
    """With --force, the files the last emit into ``out_dir`` wrote (its plan.json's exports) that
    this one does not: another tool's files of the previous plan would contradict the new plan.json
    (``emit --target torch --force`` over a plan emitted for every tool kept its megatron_args.txt).
    Only names an exporter writes (:data:`EMITTED_FILES`) listed there are removed, each with a
    warning: a hand-edited list naming the user's own file removes nothing."""
    try:
        previous = json.loads((out_dir / PLAN_FILE).read_text())["exports"]
        names = [name for record in previous.values() for name in record["files"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # no earlier emit here, or a plan.json it did not write: nothing is known to be stale
    for name in names:
        if not isinstance(name, str) or name in writing or name not in EMITTED_FILES:
            continue
        path = out_dir / name
        if not (path.is_file() or path.is_symlink()):
            continue
        path.unlink()
        log.warning("autoplan emit: --force: removed %s (the previous plan's; this plan does not write it)", path)
