"""The validation rows as ``autoplan simulate`` command lines (benchmarks/accuracy.py).

Every published or measured run the benchmark predicts is first written as the command a user
would type: the row's model as a model YAML (:func:`model_file`), its cluster, batch, sequence,
plan and ``--framework``. The benchmark parses those arguments with the command line's own parser
and builds the job with the command line's own code (autoplan.commands: the framework's plan keys
checked, its runtime applied), so what it reports is what ``autoplan simulate`` gives;
``accuracy.py --command TEXT`` prints the commands of the rows whose label contains TEXT.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from simulator.job import Job
from simulator.plan import Plan
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class RowError:
    """One row's throughput error (percent; + predicted faster) under the stack that ran it."""

    stack: str
    source: str
    label: str
    error: float


_MODELS_DIR: list[Path] = []


def models_dir() -> Path:
    """Where the rows' model files are written: the directory :func:`use_models_dir` named, else a
    temporary one, removed when the benchmark ends."""
    if not _MODELS_DIR:
        tmp = tempfile.TemporaryDirectory(prefix="autoplan-validation-models-")
        atexit.register(tmp.cleanup)
        _MODELS_DIR.append(Path(tmp.name))
    return _MODELS_DIR[0]


def use_models_dir(path: Path) -> None:
    """Write the rows' model files into ``path`` (kept: the printed commands read them)."""
    _MODELS_DIR[:] = [path.resolve()]


@dataclass(frozen=True)
class RowCommand:
    """One row's ``autoplan simulate`` arguments (its model file included) and the stack that ran it."""

    args: tuple[str, ...]
    framework: str

    def shell(self) -> str:
        """The command line, quoted for a POSIX shell."""
        return "autoplan " + shlex.join(self.args)

    def job(self) -> Job:
        """The job ``autoplan simulate`` builds from these arguments."""
        return _job(self.args)


@functools.cache
def _job(args: tuple[str, ...]) -> Job:
    from autoplan.commands import _make_job

    job, _ = _make_job(_parser().parse_args(list(args)))
    return job


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    """The command line's parser (autoplan.cli.build_parser), built once."""
    from autoplan.cli import build_parser

    return build_parser()


def model_file(model: ModelSpec, directory: Path) -> Path:
    """``model`` written as a model YAML in ``directory`` (once per name); its path."""
    path = directory / f"{model.name}.yaml"
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(model.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
    return path


def simulate_command(
    model: ModelSpec,
    models_dir: Path,
    cluster: str,
    nodes: int,
    global_batch: int,
    plan: Plan,
    framework: str,
    extra: Sequence[str] = (),
) -> RowCommand:
    """The ``autoplan simulate --fidelity analytic`` arguments of a run: ``model`` (written to
    ``models_dir``) with its sequence length, on ``nodes`` nodes of ``cluster``, ``plan`` under
    ``framework``, and ``extra`` options (--gpus-per-node, --no-dp-overlap, --reduce-dtype)."""
    args = (
        "simulate",
        "--model",
        str(model_file(model, models_dir)),
        "--cluster",
        cluster,
        "--nodes",
        str(nodes),
        "--global-batch",
        str(global_batch),
        "--seq-len",
        str(model.seq_length),
        "--plan",
        plan.to_string(),
        "--framework",
        framework,
        *extra,
        "--fidelity",
        "analytic",
    )
    return RowCommand(args, framework)
