"""What each ``autoplan`` command does once its arguments are parsed (:mod:`autoplan.cli` parses
them and turns errors into exit codes). Heavy modules are imported inside the handlers so that
``autoplan plan --help`` starts in well under a second; outputs are checked before the work
(:mod:`autoplan.outputs`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan import outputs
from hwprofiles.errors import AutoplanError, FitError, InputError

if TYPE_CHECKING:
    from autoplan.emit.export import Target
    from autoplan.frameworks import Framework
    from autoplan.search import SearchOptions
    from hwprofiles.schema import ClusterSpec
    from simulator import Fidelity
    from simulator.job import Job
    from simulator.plan import Plan
    from simulator.runtime_spec import Runtime
    from simulator.specs import ModelSpec

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = AutoplanError.exit_code  # 1: a failed run (RunError, a loss mismatch) or an internal error
EXIT_BAD_INPUT = InputError.exit_code  # 2
EXIT_NO_FIT = FitError.exit_code  # 3: also 'simulate' of a plan that does not fit


def _load_job_inputs(a: argparse.Namespace, nodes: int | None = None):
    """The model and the cluster of the command line (``nodes``: the plan command's one size of
    --nodes; the other commands read --nodes itself)."""
    from hwprofiles.load import load_cluster
    from simulator.model_files import load_model

    model = load_model(a.model, a.seq_len)
    cluster = load_cluster(a.cluster, nodes if nodes is not None else a.nodes, a.gpus_per_node)
    return model, a.memory_headroom.apply(cluster) if a.memory_headroom else cluster


def _make_job(a: argparse.Namespace) -> tuple[Job, Framework]:
    """The job of ``--plan`` priced as its framework runs it; PlanError when the framework does
    not run the plan (autoplan.frameworks.check_plan)."""
    from autoplan.frameworks import check_plan

    model, cluster, plan = _plan_inputs(a)
    fw = _framework(a, cluster)
    job = _priced(a, fw, model, cluster, plan)  # the hardware's rules first (simulator.job.Job)
    check_plan(fw, model, plan)
    return job, fw


def _plan_inputs(a: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec, Plan]:
    from simulator.plan import parse_plan

    model, cluster = _load_job_inputs(a)
    plan, _ = parse_plan(a.plan, model, cluster.num_gpus, a.global_batch)
    return model, cluster, plan


def _priced(a: argparse.Namespace, fw: Framework, model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Job:
    """The job of ``plan`` with the runtime ``fw`` runs it with (the command line's overrides applied)."""
    from autoplan.frameworks.pricing import plan_runtime
    from simulator.job import Job

    return Job(model, cluster, plan, a.global_batch, plan_runtime(fw, _runtime(a, fw), plan, cluster.node.backend))


def _framework(a: argparse.Namespace, cluster: ClusterSpec) -> Framework:
    """--framework, else the cluster file's ``framework:``, else autoplan's program."""
    from autoplan.frameworks import DEFAULT, load_framework

    return _framework_named(a, cluster) or load_framework(DEFAULT)


def _framework_named(a: argparse.Namespace, cluster: ClusterSpec) -> Framework | None:
    """The framework --framework or the cluster file's ``framework:`` names, or None."""
    from autoplan.frameworks import load_framework

    if a.framework:
        return load_framework(a.framework)
    if cluster.framework:
        try:
            return load_framework(cluster.framework)
        except InputError as e:
            raise InputError(f"cluster {cluster.name}: framework: {e}") from None
    return None


def _runtime(a: argparse.Namespace, fw: Framework) -> Runtime:
    """The framework's runtime (simulator.runtime_spec.Runtime) with the command line's overrides
    of its properties: --no-dp-overlap, --zero3-runtime, --reduce-dtype."""
    import dataclasses

    runtime = fw.base_runtime()
    changed: list[str] = []
    if a.no_dp_overlap:
        runtime = dataclasses.replace(runtime, dp_overlap=False)
        changed.append("no-dp-overlap")
    if a.zero3_runtime:
        reduce = 2 if a.zero3_runtime == "deepspeed" else runtime.sharded_reduce_bytes  # DeepSpeed reduces in bf16
        runtime = dataclasses.replace(runtime, zero3=a.zero3_runtime, sharded_reduce_bytes=reduce)
        changed.append(f"zero3-{a.zero3_runtime}")
    if a.reduce_dtype:
        runtime = dataclasses.replace(runtime, sharded_reduce_bytes=2 if a.reduce_dtype == "bf16" else 4)
        changed.append(f"reduce-{a.reduce_dtype}")
    return dataclasses.replace(runtime, name="+".join([fw.name, *changed])) if changed else runtime


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def _write_pictures(result: Any, plot: Path | None, trace: Path | None) -> None:
    """Draw the DES result (the options were checked before the work: outputs.check_timeline_outputs)."""
    outputs.warn_replacing(trace, plot)
    if trace:
        from simulator.des.trace import write_trace

        write_trace(result, trace)
        log.info("wrote trace %s (open in https://ui.perfetto.dev)", trace)
    if plot:
        from simulator.des.plot import plot_timeline

        plot_timeline(result, plot)
        log.info("wrote timeline %s", plot)


def cmd_simulate(a: argparse.Namespace) -> int:
    from autoplan.report import format_result
    from simulator import simulate

    outputs.check_timeline_outputs(a.plot, a.trace, a.fidelity, (a.model, a.cluster))
    job, fw = _make_job(a)
    if a.full and a.fidelity != "des":
        raise InputError("--full needs --fidelity des")
    fidelity, fallback = _fidelity_within_budget(job, a)
    result = simulate(job, fidelity, full=a.full, trace=bool(a.trace))
    if fallback:
        result.extra["fidelity_reason"] = fallback
    _write_pictures(result, a.plot, a.trace)
    out = result.to_dict()
    if a.json:
        _emit_json(out)
    else:
        print(format_result(out))
    _warn_bubble(out)
    if not result.fits:  # the result is the output; the exit code and this hint say it does not fit
        from autoplan.fit_hints import simulated_no_fit

        log.warning("%s", simulated_no_fit(out, result.host_fits, job.cluster, fw, job.model))
        return EXIT_NO_FIT
    return EXIT_OK


def _fidelity_within_budget(job: Job, a: argparse.Namespace) -> tuple[Fidelity, str | None]:
    """The fidelity that simulates ``job`` within the time budget (simulator.des.budget), and why
    it is not --fidelity's: the analytic estimate, warned about, when the DES would run past
    it; --full, --plot and --trace need the DES, so they are refused then (InputError)."""
    from simulator.des.budget import des_within_budget, fallback_warning

    if a.fidelity != "des":
        return a.fidelity, None
    des_only = [opt for opt, given in (("--full", a.full), ("--plot", a.plot), ("--trace", a.trace)) if given]
    reason = des_within_budget([job], 1, a.full, des_only)
    if reason is None:
        return a.fidelity, None
    log.warning("%s", fallback_warning(reason))
    return "analytic", reason


def _warn_bubble(out: dict[str, Any]) -> None:
    """A warning on stderr when the result's pipeline idles more than it computes (report.bubble_warning)."""
    from autoplan.report import bubble_warning

    warning = bubble_warning(out)
    if warning:
        log.warning("%s", warning)


def _search_options(a: argparse.Namespace, fw: Framework, objective: str) -> SearchOptions:
    from autoplan.search import SearchOptions

    cores = os.cpu_count() or 1
    return SearchOptions(
        fix=a.fix,
        top=a.top,
        jobs=min(a.jobs or cores, cores),  # CPU-bound workers: more than the cores only fork and wait
        objective=objective,
        fidelity=a.fidelity,
        progress=sys.stderr.isatty() and log.isEnabledFor(logging.INFO),
        runtime=_runtime(a, fw),
        framework=fw,
        keep_timeline=bool(a.plot or a.trace),
    )


def cmd_plan(a: argparse.Namespace) -> int:
    from autoplan.report import format_plan_report
    from autoplan.search import search
    from autoplan.sizing.sizes import parse_node_counts

    counts = parse_node_counts(a.nodes) if a.nodes else None
    sizing = bool((counts and len(counts) > 1) or a.tokens or a.deadline or a.gpu_hour_price)
    a = argparse.Namespace(**{**vars(a), "fidelity": a.fidelity or ("analytic" if sizing else "des")})
    if sizing:
        return _cmd_sweep(a, counts)
    outputs.check_timeline_outputs(a.plot, a.trace, a.fidelity, (a.model, a.cluster))
    model, cluster = _load_job_inputs(a, counts[0] if counts else None)
    fw = _framework(a, cluster)
    opts = _search_options(a, fw, a.objective or "time")
    found = search(model, cluster, a.global_batch, opts)  # nothing fits: FitError (exit 3)
    _write_pictures(found.best_result, a.plot, a.trace)
    out = found.to_dict()
    if a.json:
        _emit_json(out)
    else:
        print(format_plan_report(out))
    _warn_bubble(out["best"])
    return EXIT_OK


def _cmd_sweep(a: argparse.Namespace, counts: list[int] | None) -> int:
    """``plan`` over several sizes, or with --tokens, --deadline or --gpu-hour-price:
    autoplan.sizing. Each size is searched for its best plan (the finalists within the search's
    tolerance of the best simulated, analytic unless --fidelity des)."""
    import dataclasses

    from autoplan.sizing.report import format_sweep, plot_sweep
    from autoplan.sizing.sweep import Goal, sweep

    if a.trace:
        raise InputError("--trace: a sweep over sizes has no single timeline; plan one size for its trace")
    if a.gpu_hour_price and not a.tokens:
        raise InputError("--gpu-hour-price needs --tokens (a cost is that of training on them)")
    if a.plot and not a.tokens:
        raise InputError("--plot over several sizes draws days to train against cost: give --tokens")
    outputs.check_picture_file(a.plot, "--plot")
    outputs.check_distinct_outputs({"--plot": a.plot}, (a.model, a.cluster))
    model, cluster = _load_job_inputs(a, counts[0] if counts else None)
    fw = _framework(a, cluster)
    price = a.gpu_hour_price or cluster.price_per_gpu_hour
    goal = Goal(a.tokens, price, a.deadline, a.objective or ("cost" if a.deadline else "time"))
    opts = dataclasses.replace(_search_options(a, fw, "time"), top=1, keep_timeline=False)
    found = sweep(model, cluster, a.global_batch, counts or [cluster.nodes], opts, goal)
    out = found.to_dict()
    if a.plot:
        outputs.warn_replacing(a.plot)
        plot_sweep(out, a.plot)
    if a.json:
        _emit_json(out)
    else:
        print(format_sweep(out))
    return EXIT_OK


def cmd_emit(a: argparse.Namespace) -> int:
    """Write the run dir: the named framework's files (and autoplan's program where it runs the
    plan), or with --target the tools named; each tool's prediction priced as its framework runs it."""
    from autoplan.emit.export import TARGETS
    from autoplan.emit.writer import EXPORTERS, export_summary, write_run_dir, written_estimate
    from autoplan.frameworks import check_plan, framework_of_target
    from autoplan.runtime.config import TrainSettings
    from autoplan.runtime.support import unsupported_reason
    from simulator import simulate

    outputs.check_run_dir(a.out, a.force)
    model, cluster, plan = _plan_inputs(a)
    named = _framework_named(a, cluster)
    asked = a.target is not TARGETS  # tools named with --target (not the default: all, or the framework's)
    targets = a.target if asked or named is None else _framework_targets(named)
    jobs = {t: _priced(a, framework_of_target(t), model, cluster, plan) for t in targets}  # the hardware's rules
    if named:
        check_plan(named, model, plan)
    if "torch" in targets:  # autoplan's own program: it must run the plan, and plan.json's prediction is for it
        reason = unsupported_reason(model, plan, jobs["torch"].m)
        if reason and named is not None and not named.program and not asked:  # the framework's files only
            if len(jobs) == 1:
                raise InputError(
                    f"--plan: autoplan writes no {named.name} files, and its own program cannot run this plan: {reason}"
                )
            log.info("torch      not written: autoplan's program cannot run this plan: %s", reason)
            del jobs["torch"]
        elif reason:
            raise InputError(
                f"--plan: autoplan's torch program cannot run this plan correctly: {reason} "
                "(write for the other tools with --target megatron,deepspeed,torchtitan)"
            )
    job = jobs.get("torch") or next(iter(jobs.values()))
    prediction = simulate(job, "analytic").to_dict()
    exports = [EXPORTERS[t](jobs[t], TrainSettings(), a.out) for t in TARGETS if t in jobs]
    files = write_run_dir(job, prediction, a.out, force=a.force, exports=exports)
    written = {e.target: written_estimate(e, jobs[e.target]) for e in exports}
    # files that run a plan that does not fit (emit exits 3 when the user asked for them: below)
    misfits = [t for t, found in written.items() if found is not None and not found.fits]
    # what runs differently from the plan or does not fit, or a tool named refusing, is a warning
    for export in exports:
        warn = export.changes or (export.refused and asked) or export.target in misfits
        for line in export_summary(export, jobs[export.target], written[export.target]):
            log.log(logging.WARNING if warn else logging.INFO, "%s", line)
    hint = f"; run it with: autoplan run {a.out}" if "torch" in jobs and "torch" not in misfits else ""
    log.info("wrote %d files to %s%s", len(files), a.out, hint)
    for f in files:
        print(f)
    # what was asked for: the tools named, else the framework's files (autoplan's program by default)
    framework = named.name if named else "autoplan"
    asked_for = set(jobs) if asked else {t for t in jobs if framework_of_target(t).name == framework}
    return EXIT_NO_FIT if asked_for & set(misfits) else EXIT_OK


def _framework_targets(fw: Framework) -> tuple[Target, ...]:
    """What ``emit --framework NAME`` writes: the framework's files and autoplan's program (which
    is left out, with a note, where it cannot run the plan); autoplan's program alone for a
    framework whose files autoplan does not write (said on stderr)."""
    if fw.export is None:
        log.warning("autoplan writes no %s files (%s); writing autoplan's program for the plan", fw.name, fw.title)
        return ("torch",)
    return tuple(dict.fromkeys((fw.export, "torch")))


def cmd_run(a: argparse.Namespace) -> int:
    from autoplan.verify import format_report, run_and_verify

    result = run_and_verify(  # a failed run: RunError (exit 1)
        a.dir, steps=a.steps, timeout_s=a.timeout, check_memory=not a.allow_oversubscribe
    )
    if a.json:
        _emit_json(result)
    else:
        print(format_report(result))
    return EXIT_OK if result.get("loss_match", True) else EXIT_FAILED


def cmd_calibrate(a: argparse.Namespace) -> int:
    from autoplan.runtime.tensor_parallel import split_layer
    from hwprofiles.calibrate import run_calibration

    outputs.check_output_file(a.out, "-o")
    outputs.check_output_file(a.node_out, "--node-out")
    outputs.check_distinct_outputs({"-o": a.out, "--node-out": a.node_out}, ())
    progress = log.isEnabledFor(logging.INFO) and not a.no_progress
    files = run_calibration(
        a.device, a.out, split_layer, quick=a.quick, ranks=a.ranks, progress=progress, node_out=a.node_out
    )
    for f in files:
        print(f)
    return EXIT_OK


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "plan": cmd_plan,
    "simulate": cmd_simulate,
    "emit": cmd_emit,
    "run": cmd_run,
    "calibrate": cmd_calibrate,
}
