"""Whether a framework's own files run a plan as planned: the last check of the search's
finalists (autoplan.search), so that ``autoplan plan --framework NAME`` proposes only plans whose
``autoplan emit`` files run them unchanged. The exporters (autoplan.emit) hold those rules,
written once: the closest plan each tool runs, and what it refuses."""

from __future__ import annotations

from pathlib import Path

from autoplan.frameworks import Framework
from autoplan.runtime.config import TrainSettings
from autoplan.runtime.support import unsupported_reason
from simulator.job import Job


def files_differ(fw: Framework | None, job: Job) -> str | None:
    """Why ``fw``'s files would not run ``job``'s plan as planned (the exporter's refusal or its
    first change; for autoplan's program, what it cannot run), or None: they would, or the
    framework has no files autoplan writes."""
    if fw is None or fw.export is None:
        return None
    if fw.export == "torch":
        return unsupported_reason(job.model, job.plan, job.m)
    from autoplan.emit.writer import EXPORTERS

    export = EXPORTERS[fw.export](job, TrainSettings(), Path("."))
    if export.refused:
        return export.refused
    return export.changes[0].describe() if export.changes else None
