"""The ``autoplan`` command line (docs/design.md section 3).

Exit codes come from the error classes of :mod:`hwprofiles.errors`: 0 ok; 2 bad input
(:class:`InputError`, :class:`SpecError`, :class:`PlanError`); 3 no plan fits (:class:`FitError`);
1 a run that failed (:class:`RunError`) or an internal error. Any :class:`AutoplanError` ends
the command with one line ``autoplan: error: ...`` on stderr. Diagnostics and progress go
through :mod:`logging` (configured in :func:`main`: plain messages on stderr; ``-v`` adds
debug messages, ``-q`` keeps only warnings); the command's output (report, JSON) goes to
stdout. Heavy modules are imported inside the handlers so that ``autoplan plan --help``
starts in well under a second.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from autoplan.outputs import check_output_file, check_run_dir
from hwprofiles.errors import AutoplanError, FitError, InputError

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = AutoplanError.exit_code  # 1: a failed run (RunError, a loss mismatch) or an internal error
EXIT_BAD_INPUT = InputError.exit_code  # 2
EXIT_NO_FIT = FitError.exit_code  # 3: also 'simulate' of a plan that does not fit

EXAMPLES = {
    "plan": """examples:
  autoplan plan --model gpt3-175b --cluster dgx-a100-80gb --nodes 128 --global-batch 1536
  autoplan plan --model llama2-70b --cluster dgx-h100 --nodes 16 --global-batch 512 --fix t=8,zero=1 --top 5
  autoplan plan --model gpt-1t --cluster dgx-a100-80gb --nodes 384 --global-batch 3072 --json > plan.json
  autoplan plan --model llama3-8b --cluster hgx-h200 --nodes 4 --global-batch 256 --objective cost --plot best.png""",
    "simulate": """examples:
  autoplan simulate --model gpt3-175b --cluster dgx-a100-80gb --nodes 128 --global-batch 1536 --plan t=8,p=16,mb=1,ckpt=full
  autoplan simulate --model llama2-7b --cluster dgx-h100 --global-batch 64 --plan t=2,p=2,zero=1 --trace trace.json --plot timeline.png
  autoplan simulate --model my-model.yaml --cluster my-cluster.yaml --global-batch 256 --plan t=4,p=2,schedule=interleaved,v=2 --fidelity analytic --json""",
    "emit": """examples:
  autoplan emit --model tiny --cluster localhost-cpu --global-batch 8 --plan t=2,p=2 -o runs/tiny-t2p2
  autoplan emit --model tiny --cluster localhost-cpu --gpus-per-node 2 --global-batch 8 --plan t=2 -o runs/tiny-t2
  autoplan emit --model llama2-7b --cluster dgx-h100 --nodes 2 --global-batch 256 --plan t=4,p=2,zero=1,ckpt=selective -o runs/llama7b""",
    "run": """examples:
  autoplan run runs/tiny-t2p2 --steps 5
  autoplan run runs/tiny-t2p2 --json > measured.json""",
    "calibrate": """examples:
  autoplan calibrate --device cpu --ranks 4 -o my-cpu.yaml --node-out my-node.yaml
  autoplan calibrate --device cuda -o hwprofiles/gpus/h200-measured.yaml
  autoplan calibrate --device cpu --quick -o /tmp/quick.yaml""",
}

MAIN_HELP = """autoplan: find, simulate, emit and verify parallel training plans for transformer models.

commands:
  plan       search t/p/d/ZeRO/microbatch/recompute/schedule/offload for the fastest plan that fits
  simulate   predict one plan's step time, memory and timeline (discrete-event or analytic)
  emit       write a runnable torchrun program (+ Megatron-LM, DeepSpeed, torchtitan, SLURM configs)
  run        launch an emitted program, measure it, compare with the prediction and a 1-process run
  calibrate  measure this machine's GEMM, memory and collective speeds into a hardware profile

examples:
  autoplan plan --model gpt3-175b --cluster dgx-a100-80gb --nodes 128 --global-batch 1536
  autoplan simulate --model gpt3-175b --cluster dgx-a100-80gb --nodes 128 --global-batch 1536 --plan t=8,p=16,ckpt=full --plot t.png
  autoplan emit --model tiny --cluster localhost-cpu --global-batch 8 --plan t=2,p=2 -o runs/tiny && autoplan run runs/tiny

Models: built-in names (gpt3-175b, gpt-1t, llama2-7b, llama2-70b, llama3-8b, tiny), a model YAML or a
Hugging Face config.json. Clusters: a cluster name or file, or a node name (with --nodes)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line, exit 2
        sub = self.prog.removeprefix("autoplan").strip()
        raise InputError(f"{sub + ': ' if sub else ''}{message}")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _job_args(p: argparse.ArgumentParser, plan_required: bool) -> None:
    p.add_argument("--model", required=True, help="built-in model name, model YAML, or Hugging Face config.json")
    p.add_argument("--cluster", required=True, help="cluster name or file, or a node name/file")
    p.add_argument("--nodes", type=_positive_int, help="number of nodes (overrides the cluster file)")
    p.add_argument("--gpus-per-node", type=_positive_int, help="use only this many GPUs (ranks) of each node")
    p.add_argument("--global-batch", type=_positive_int, required=True, help="global batch B in sequences")
    p.add_argument("--seq-len", type=_positive_int, help="sequence length (default: the model's)")
    if plan_required:
        p.add_argument("--plan", required=True, help="plan string, e.g. t=8,p=8,mb=1,zero=1,ckpt=full,schedule=1f1b")
    p.add_argument(
        "--no-dp-overlap",
        action="store_true",
        help="model a program that reduces gradients after the last backward instead of overlapping "
        "bucketed reductions with it (Megatron-LM 2021 local DDP, Megatron-DeepSpeed without bucketing)",
    )


def build_parser() -> argparse.ArgumentParser:
    root = _Parser(prog="autoplan", description=MAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    loud = root.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="store_true", help="also print debug messages on stderr")
    loud.add_argument("-q", "--quiet", action="store_true", help="print only warnings and errors on stderr")
    sub = root.add_subparsers(dest="command", parser_class=_Parser, metavar="{plan,simulate,emit,run,calibrate}")

    def cmd(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    p = cmd("plan", "Search the plan space for the fastest (or cheapest) plan that fits.")
    _job_args(p, plan_required=False)
    p.add_argument("--fix", default="", help="pin plan keys, e.g. t=8,p=8,zero=0,ckpt=full")
    p.add_argument("--top", type=_positive_int, default=8, help="simulate and show the K best candidates (default 8)")
    p.add_argument("--jobs", type=_positive_int, default=None, help="worker processes (default: all cores)")
    p.add_argument(
        "--objective",
        choices=("time", "cost"),
        default="time",
        help="time: fastest step; cost: fewest GPU-hours per million tokens",
    )
    p.add_argument(
        "--fidelity", choices=("des", "analytic"), default="des", help="how the top K are simulated (default des)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--plot", type=Path, help="write the best plan's timeline PNG")
    p.add_argument("--trace", type=Path, help="write the best plan's Chrome/Perfetto trace JSON")

    p = cmd("simulate", "Predict one plan's step time, throughput and memory.")
    _job_args(p, plan_required=True)
    p.add_argument(
        "--fidelity",
        choices=("des", "analytic"),
        default="des",
        help="des: discrete-event simulation (default); analytic: closed-form estimate",
    )
    p.add_argument("--full", action="store_true", help="DES: simulate every rank instead of one pipeline by symmetry")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--plot", type=Path, help="write a timeline PNG (DES)")
    p.add_argument("--trace", type=Path, help="write a Chrome/Perfetto trace JSON (DES)")

    p = cmd("emit", "Write a run directory: torch program launch files and Megatron/DeepSpeed/torchtitan configs.")
    _job_args(p, plan_required=True)
    p.add_argument("-o", "--out", type=Path, required=True, help="output directory (new or empty)")
    p.add_argument("--force", action="store_true", help="replace the emitted files in a folder that already has files")

    p = cmd("run", "Run an emitted plan with torchrun and compare with the prediction.")
    p.add_argument("dir", type=Path, help="a directory written by 'autoplan emit'")
    p.add_argument("--steps", type=_positive_int, default=5, help="timed steps after warm-up (default 5)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the whole run is stopped (default 600)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = cmd("calibrate", "Measure this machine and write a hardware profile.")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("-o", "--out", type=Path, required=True, help="profile YAML to write")
    p.add_argument("--quick", action="store_true", help="a fast, coarse measurement (under a minute)")
    p.add_argument("--ranks", type=_positive_int, default=2, help="processes for the collective benchmarks (default 2)")
    p.add_argument("--node-out", type=Path, help="node profile to write (default: <stem>-node.yaml beside -o)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (as with -q)")
    return root


# ------------------------------------------------------------------------------ handlers


def _load_job_inputs(a: argparse.Namespace):
    from hwprofiles.load import load_cluster
    from simulator.specs import load_model

    model = load_model(a.model, a.seq_len)
    cluster = load_cluster(a.cluster, a.nodes, a.gpus_per_node)
    return model, cluster


def _make_job(a: argparse.Namespace):
    from simulator.job import Job
    from simulator.plan import parse_plan

    model, cluster = _load_job_inputs(a)
    plan, _ = parse_plan(a.plan, model, cluster.num_gpus, a.global_batch)
    return Job(model, cluster, plan, a.global_batch, _runtime(a))


def _runtime(a: argparse.Namespace):
    from simulator.job import NO_DP_OVERLAP, OVERLAPPED

    return NO_DP_OVERLAP if a.no_dp_overlap else OVERLAPPED


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def _check_picture_outputs(a: argparse.Namespace) -> None:
    """--plot and --trace: a DES result to draw and paths that can be written, before the work."""
    if (a.plot or a.trace) and a.fidelity != "des":
        raise InputError("--plot and --trace need --fidelity des (the analytic estimate has no timeline)")
    check_output_file(a.plot, "--plot")
    check_output_file(a.trace, "--trace")


def _write_pictures(result: Any, plot: Path | None, trace: Path | None) -> None:
    if not plot and not trace:
        return
    if result.fidelity != "des":
        raise InputError("--plot and --trace need --fidelity des (the analytic estimate has no timeline)")
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

    _check_picture_outputs(a)
    job = _make_job(a)
    if a.full and a.fidelity != "des":
        raise InputError("--full needs --fidelity des")
    result = simulate(job, a.fidelity, full=a.full, trace=bool(a.trace))
    _write_pictures(result, a.plot, a.trace)
    out = result.to_dict()
    if a.json:
        _emit_json(out)
    else:
        print(format_result(out))
    if not result.fits:  # the result is the output; the exit code and this hint say it does not fit
        log.warning("%s", _no_fit_hint(out, result.host_fits))
        return EXIT_NO_FIT
    return EXIT_OK


def _no_fit_hint(out: dict[str, Any], host_fits: bool) -> str:
    """Why a simulated plan does not fit and what would help, from its memory breakdown."""
    if not host_fits:
        return (
            f"autoplan: the plan does not fit: the offloaded optimizer state ({out.get('host_memory_gib', 0):.0f} GiB) "
            "exceeds host memory; try offload=nvme with zero=3, or more nodes"
        )
    need, cap = out["peak_memory_gib"], out["memory_capacity_gib"]
    mem = out["memory_breakdown_gib"]
    plan = out["plan"]
    hints = []
    if mem["activations"] > 0.3 * need:
        hints.append("ckpt=full" if plan["ckpt"] != "full" else "a smaller mb")
        if plan["t"] > 1 and not plan["sp"]:
            hints.append("sp=1")
    if mem["optimizer"] + mem["grads"] + mem["params"] > 0.3 * need:
        hints.append(f"zero={min(3, plan['zero'] + 1)}" if plan["zero"] < 3 else "offload=cpu")
        hints.append("more pipeline stages (p) or tensor parallelism (t)")
    return (
        f"autoplan: the plan does not fit: it needs {need:.1f} GiB per GPU but {cap:.1f} GiB is usable; "
        f"try {', '.join(hints) or 'more GPUs'} (or 'autoplan plan' to search)"
    )


def cmd_plan(a: argparse.Namespace) -> int:
    from autoplan.report import format_plan_report
    from autoplan.search import SearchOptions, search

    _check_picture_outputs(a)
    model, cluster = _load_job_inputs(a)
    opts = SearchOptions(
        fix=a.fix,
        top=a.top,
        jobs=a.jobs or os.cpu_count() or 1,
        objective=a.objective,
        fidelity=a.fidelity,
        progress=sys.stderr.isatty() and log.isEnabledFor(logging.INFO),
        runtime=_runtime(a),
        keep_timeline=bool(a.plot or a.trace),
    )
    found = search(model, cluster, a.global_batch, opts)  # nothing fits: FitError (exit 3)
    _write_pictures(found.best_result, a.plot, a.trace)
    if a.json:
        _emit_json(found.to_dict())
    else:
        print(format_plan_report(found.to_dict()))
    return EXIT_OK


def cmd_emit(a: argparse.Namespace) -> int:
    from autoplan.emit.writer import write_run_dir
    from autoplan.runtime.support import program_job, unsupported_reason
    from simulator import simulate

    check_run_dir(a.out, a.force)
    job = _make_job(a)
    reason = unsupported_reason(job.model, job.plan, job.m)
    if reason:
        raise InputError(f"--plan: the runtime cannot run this plan correctly: {reason}")
    job = program_job(job)
    prediction = simulate(job, "analytic").to_dict()
    files = write_run_dir(job, prediction, a.out, force=a.force)
    log.info("wrote %d files to %s; run it with: autoplan run %s", len(files), a.out, a.out)
    for f in files:
        print(f)
    return EXIT_OK


def cmd_run(a: argparse.Namespace) -> int:
    from autoplan.verify import format_report, run_and_verify

    result = run_and_verify(a.dir, steps=a.steps, timeout_s=a.timeout)  # a failed run: RunError (exit 1)
    if a.json:
        _emit_json(result)
    else:
        print(format_report(result))
    return EXIT_OK if result.get("loss_match", True) else EXIT_FAILED


def cmd_calibrate(a: argparse.Namespace) -> int:
    from hwprofiles.calibrate import run_calibration

    check_output_file(a.out, "-o")
    check_output_file(a.node_out, "--node-out")
    progress = log.isEnabledFor(logging.INFO) and not a.no_progress
    files = run_calibration(a.device, a.out, quick=a.quick, ranks=a.ranks, progress=progress, node_out=a.node_out)
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


class _StderrHandler(logging.StreamHandler):
    """A handler on the ``sys.stderr`` of the moment (a caller or a test may have replaced it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


#: the packages whose diagnostics the command line shows (third-party loggers are left alone)
LOGGERS = ("autoplan", "hwprofiles", "simulator", "benchmarks")


def configure_logging(level: int = logging.INFO) -> None:
    """Plain messages (``%(message)s``) of our packages' loggers on stderr, at ``level``.
    Idempotent: a second call only changes the level."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)


def _fail(msg: str, code: int) -> int:
    print(f"autoplan: error: {' '.join(str(msg).split()).removeprefix('autoplan: ')}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    try:
        a = build_parser().parse_args(argv)
        configure_logging(logging.DEBUG if a.verbose else logging.WARNING if a.quiet else logging.INFO)
        if not a.command:
            build_parser().print_help()
            return EXIT_BAD_INPUT
        return HANDLERS[a.command](a)
    except AutoplanError as e:  # InputError/SpecError/PlanError 2, FitError 3, RunError 1
        return _fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # an internal error: one line, the traceback only on request
        if os.environ.get("AUTOPLAN_DEBUG"):
            raise
        return _fail(f"internal error: {type(e).__name__}: {e} (set AUTOPLAN_DEBUG=1 for the traceback)", EXIT_FAILED)


if __name__ == "__main__":
    raise SystemExit(main())
