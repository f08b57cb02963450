"""The ``autoplan`` command line (docs/design.md section 3).

Exit codes come from the error classes of :mod:`hwprofiles.errors`: 0 ok; 2 bad input
(:class:`InputError`, :class:`SpecError`, :class:`PlanError`); 3 no plan fits (:class:`FitError`);
1 a run that failed (:class:`RunError`) or an internal error. Any :class:`AutoplanError` ends
the command with one line ``autoplan: error: ...`` on stderr. Diagnostics and progress go
through :mod:`logging` (configured in :func:`main`: plain messages on stderr; ``-v`` adds
debug messages, ``-q`` keeps only warnings); the command's output (report, JSON) goes to
stdout. The handlers are in :mod:`autoplan.commands`.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from autoplan import __version__, interrupt, logs
from autoplan.commands import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NO_FIT, EXIT_OK, HANDLERS
from autoplan.emit import safe_text
from autoplan.emit.export import TARGETS, Target
from autoplan.frameworks import FRAMEWORKS
from hwprofiles.errors import AutoplanError, InputError
from hwprofiles.headroom import MemoryHeadroom
from hwprofiles.number_text import parse_decimal, parse_integer
from simulator.model_files import builtin_models

log = logging.getLogger(__name__)

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_NO_FIT", "EXIT_OK", "HANDLERS", "build_parser", "main"]

EXAMPLES = {
    "plan": """examples:
  autoplan plan --model gpt3-175b --cluster dgx-a100-80gb --nodes 128 --global-batch 1536
  autoplan plan --model llama2-70b --cluster dgx-h100 --nodes 16 --global-batch 512 --fix t=8,zero=1 --top 5
  autoplan plan --model gpt-1t --cluster dgx-a100-80gb --nodes 384 --global-batch 3072 --json > plan.json
  autoplan plan --model llama3-8b --cluster hgx-h200 --nodes 4 --global-batch 256 --objective cost --plot best.png
  autoplan plan --model gpt3-175b --cluster dgx-h100 --nodes 16:128:16 --global-batch 1536 --tokens 300e9 --deadline 20""",
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

Models: built-in names ({models}), a model YAML or a Hugging Face config.json.
Clusters: a cluster name or file, or a node name (with --nodes)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line, exit 2
        sub = self.prog.removeprefix("autoplan").strip()
        raise InputError(f"{sub + ': ' if sub else ''}{message}")


def _positive_int(text: str) -> int:
    try:
        v = parse_integer(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = parse_decimal(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return v


def _memory_headroom(text: str) -> MemoryHeadroom:
    try:
        return MemoryHeadroom.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _targets(text: str) -> tuple[Target, ...]:
    """``--target``: comma-separated tool names, or ``all``."""
    names = [t.strip() for t in text.split(",")]
    if "" in names:
        raise argparse.ArgumentTypeError(f"an empty name in {text!r} (expected {', '.join(TARGETS)} or all)")
    if names == ["all"]:
        return TARGETS
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown target {', '.join(unknown) or repr(text)} (expected {', '.join(TARGETS)} or all)"
        )
    return tuple(t for t in TARGETS if t in names)


def _job_args(p: argparse.ArgumentParser, plan_required: bool, node_sizes: bool = False) -> None:
    p.add_argument(
        "--model",
        required=True,
        help=f"built-in model name ({', '.join(builtin_models())}), model YAML, or Hugging Face config.json",
    )
    p.add_argument("--cluster", required=True, help="cluster name or file, or a node name/file")
    if node_sizes:
        p.add_argument(
            "--nodes",
            metavar="N|A:B|A:B:S|A,B,C",
            help="number of nodes (overrides the cluster file); a range A:B (every count), A:B:S (in steps of S) "
            "or a list A,B,C plans each size and compares them",
        )
    else:
        p.add_argument("--nodes", type=_positive_int, help="number of nodes (overrides the cluster file)")
    p.add_argument("--gpus-per-node", type=_positive_int, help="use only this many GPUs (ranks) of each node")
    p.add_argument("--global-batch", type=_positive_int, required=True, help="global batch B in sequences")
    p.add_argument("--seq-len", type=_positive_int, help="sequence length (default: the model's)")
    p.add_argument(
        "--memory-headroom",
        type=_memory_headroom,
        metavar="GIB|PCT%",
        help="GPU memory every plan must leave free: GiB (e.g. 4) or a share of the GPU's memory (e.g. 10%%); "
        "default none (only the GPU profile's runtime reserve and allocator fragmentation)",
    )
    if plan_required:
        p.add_argument("--plan", required=True, help="plan string, e.g. t=8,p=8,mb=1,zero=1,ckpt=full,schedule=1f1b")
    p.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        help="the training stack that runs the plan (default: the cluster file's framework:, else autoplan, "
        "autoplan's own program): only plans it runs, priced as it runs them "
        "(autoplan/frameworks/profiles/<name>.yaml)",
    )
    p.add_argument(
        "--no-dp-overlap",
        action="store_true",
        help="the framework reduces gradients after the last backward instead of overlapping bucketed reductions "
        "with it (Megatron-LM 2021 local DDP, Megatron-DeepSpeed without bucketing): overrides its profile",
    )
    p.add_argument(
        "--zero3-runtime",
        choices=("fsdp2", "deepspeed"),
        help="how ZeRO-3 runs, overriding the framework's profile: fsdp2 (PyTorch fully_shard: parameters copied "
        "out of each all-gather) or deepspeed (DeepSpeed stage 3: bf16 reduction, a fully recomputed layer "
        "gathered once more in backward)",
    )
    p.add_argument(
        "--reduce-dtype",
        choices=("fp32", "bf16"),
        help="the dtype of ZeRO-2/3 gradient reduce-scatters, overriding the framework's profile (FSDP "
        "MixedPrecision reduce_dtype, torchtitan mixed_precision_reduce, DeepSpeed communication_data_type)",
    )


def _loudness_args(p: argparse.ArgumentParser, default: Any) -> None:
    """-v and -q, one or the other, on the root parser and on each command's."""
    loud = p.add_mutually_exclusive_group()
    loud.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="also print debug messages on stderr"
    )
    loud.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="print only warnings and errors on stderr"
    )


def _plan_args(p: argparse.ArgumentParser) -> None:
    """``autoplan plan``: the job, then how to search and what to show."""
    _job_args(p, plan_required=False, node_sizes=True)
    p.add_argument("--fix", default="", help="pin plan keys, e.g. t=8,p=8,zero=0,ckpt=full")
    p.add_argument("--top", type=_positive_int, default=8, help="simulate and show the K best candidates (default 8)")
    p.add_argument("--jobs", type=_positive_int, default=None, help="worker processes (default and most: the cores)")
    p.add_argument(
        "--objective",
        choices=("time", "cost"),
        help="time: fastest step; cost: fewest GPU-hours per million tokens (default time; with --deadline, cost). "
        "Over several --nodes sizes: the size that trains fastest or with the fewest GPU-hours",
    )
    p.add_argument(
        "--tokens",
        type=_positive_float,
        help="tokens to train (e.g. 2e12): each size's days to train, GPU-hours and cost, interruptions priced in",
    )
    p.add_argument(
        "--gpu-hour-price",
        type=_positive_float,
        help="price of one GPU-hour (default: the cluster or node file's gpu_hour_price): each size's cost",
    )
    p.add_argument(
        "--deadline", type=_positive_float, metavar="DAYS", help="with --tokens: the cheapest size that trains in time"
    )
    p.add_argument(
        "--fidelity",
        choices=("des", "analytic"),
        help="how the top K are simulated (default des; over several --nodes sizes analytic, a search per size)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--plot", type=Path, help="write the best plan's timeline PNG")
    p.add_argument("--trace", type=Path, help="write the best plan's Chrome/Perfetto trace JSON")


def _simulate_args(p: argparse.ArgumentParser) -> None:
    """``autoplan simulate``: the job and its plan, then the fidelity and the outputs."""
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


def _emit_args(p: argparse.ArgumentParser) -> None:
    """``autoplan emit``: the job and its plan, then where to write and for which tools."""
    _job_args(p, plan_required=True)
    p.add_argument("-o", "--out", type=Path, required=True, help="output directory (new or empty)")
    p.add_argument("--force", action="store_true", help="replace the emitted files in a folder that already has files")
    p.add_argument(
        "--target",
        type=_targets,
        default=TARGETS,
        metavar="{torch,megatron,deepspeed,torchtitan,all}",
        help="which tools to write for, comma-separated (default all): torch (launch.sh for autoplan's program), "
        "megatron (Megatron-LM arguments + launch), deepspeed (ds_config.json + deepspeed_setup.py), "
        "torchtitan (a torchtitan 0.3 config module); plan.json is always written",
    )


def _run_args(p: argparse.ArgumentParser) -> None:
    """``autoplan run``: the emitted directory and how long to run it."""
    p.add_argument("dir", type=Path, help="a directory written by 'autoplan emit'")
    p.add_argument("--steps", type=_positive_int, default=5, help="timed steps after warm-up (default 5)")
    p.add_argument(
        "--timeout", type=_positive_float, default=600.0, help="seconds before the whole run is stopped (default 600)"
    )
    p.add_argument(
        "--allow-oversubscribe",
        action="store_true",
        help="launch CPU ranks even when their predicted memory exceeds this machine's available memory "
        "(refused by default: the out-of-memory killer would end them)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    """``autoplan calibrate``: what to measure and where to write the profiles."""
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="what to measure: cpu (one core per rank, gloo) or cuda (the GPUs, NCCL); default cpu",
    )
    p.add_argument("-o", "--out", type=Path, required=True, help="profile YAML to write")
    p.add_argument("--quick", action="store_true", help="a fast, coarse measurement (under a minute)")
    p.add_argument("--ranks", type=_positive_int, default=2, help="processes for the collective benchmarks (default 2)")
    p.add_argument("--node-out", type=Path, help="node profile to write (default: <stem>-node.yaml beside -o)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (as with -q)")


#: each command: its one-line help (also its description) and the function adding its arguments, in --help's order
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "plan": ("Search the plan space for the fastest (or cheapest) plan that fits.", _plan_args),
    "simulate": ("Predict one plan's step time, throughput and memory.", _simulate_args),
    "emit": (
        "Write a run directory: torch program launch files and Megatron/DeepSpeed/torchtitan configs.",
        _emit_args,
    ),
    "run": ("Run an emitted plan with torchrun and compare with the prediction.", _run_args),
    "calibrate": ("Measure this machine and write a hardware profile.", _calibrate_args),
}


def build_parser() -> argparse.ArgumentParser:
    """The root parser (``--version``, -v/-q) with one subparser per command of :data:`COMMANDS`."""
    root = _Parser(
        prog="autoplan",
        description=MAIN_HELP.format(models=", ".join(builtin_models())),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument("--version", action="version", version=f"autoplan {__version__}")
    _loudness_args(root, default=False)
    sub = root.add_subparsers(dest="command", parser_class=_Parser, metavar="{plan,simulate,emit,run,calibrate}")
    for name, (help_, add_args) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _loudness_args(p, default=argparse.SUPPRESS)  # -v/-q also after the command; not given: the root's
        add_args(p)
    return root


#: the longest error line: a message quoting a 100 kB --plan keeps its start and its end
ERROR_LINE_MAX = 1000


def _fail(msg: str, code: int) -> int:
    if interrupt.interrupted():  # an error a Ctrl-C caused (a library may wrap its KeyboardInterrupt)
        return interrupt.report()
    line = safe_text.printable(" ".join(str(msg).split())).removeprefix("autoplan: ")
    if len(line) > ERROR_LINE_MAX:
        cut = len(line) - ERROR_LINE_MAX
        line = f"{line[: ERROR_LINE_MAX * 3 // 4]} ... ({cut:,} characters left out) ... {line[-ERROR_LINE_MAX // 4 :]}"
    print(f"autoplan: error: {line}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    try:
        a = build_parser().parse_args(argv)
        if a.verbose and a.quiet:  # one before the command, the other after it
            raise InputError("argument -q/--quiet: not allowed with argument -v/--verbose")
        logs.configure(logging.DEBUG if a.verbose else logging.WARNING if a.quiet else logging.INFO)
        if not a.command:
            build_parser().print_help()
            return EXIT_BAD_INPUT
        code = HANDLERS[a.command](a)
        interrupt.check()  # a Ctrl-C whose KeyboardInterrupt the interpreter dropped
        return code
    except AutoplanError as e:  # InputError/SpecError/PlanError 2, FitError 3, RunError 1
        return _fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        return interrupt.report()
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # an internal error: one line, the traceback only on request
        if os.environ.get("AUTOPLAN_DEBUG"):
            raise
        return _fail(f"internal error: {type(e).__name__}: {e} (set AUTOPLAN_DEBUG=1 for the traceback)", EXIT_FAILED)


def run() -> NoReturn:
    """The ``autoplan`` command: :func:`main` in a process of its own, exiting with its code. What
    is left at exit is frozen out of the garbage collector first (``gc.freeze``): the interpreter's
    last collection would walk every object the libraries made (pandas through OR-tools, pydantic,
    numpy), a fifth of a second of a main-job ``plan``; modules are still torn down, files closed
    and exit handlers run. After a Ctrl-C it exits at once instead (:mod:`autoplan.interrupt`)."""
    code = main()
    if interrupt.interrupted():  # exit now: autoplan.interrupt says why
        interrupt.leave(code if code == interrupt.EXIT_INTERRUPTED else interrupt.report())
    gc.freeze()
    raise SystemExit(code)


if __name__ == "__main__":
    interrupt.install()
    run()
