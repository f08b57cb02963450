"""``autoplan calibrate``: measure this machine with torch and write hardware profiles.

Output layout: the GPU profile (``hwprofiles.schema.GpuProfile``: GEMM table and fitted
curve, memory bandwidth, per-op overhead) goes to ``out``; when collectives were measured
(``ranks`` >= 2), a node profile (``NodeProfile``: the measured intra-node link, host copies
as ``pcie``, host memory, host Adam, compute slots) goes to ``node_out``, by default next to
``out`` as ``<stem>-node.yaml`` (or, when ``out`` lies in the built-in ``hwprofiles/gpus/``
folder, as ``hwprofiles/nodes/<stem>-node.yaml``, so each built-in folder holds one kind of
profile). The node names its GPU by profile name when ``out`` is a built-in, else by the GPU
file's absolute path (which ``hwprofiles.load`` resolves), so both files load with
``load_gpu`` / ``load_node`` and ``--cluster <node file>`` works. No schema change was needed.

CPU calibration runs every compute benchmark with ``torch.set_num_threads(1)``: one rank per
core, as the CPU verification runs (OMP_NUM_THREADS=1 per rank). The committed CPU profiles
were made with::

    python -m hwprofiles.calibrate --device cpu --ranks 4 \\
        -o hwprofiles/gpus/cpu.yaml --node-out hwprofiles/nodes/localhost-cpu.yaml

torch is imported by the ``calibrate_*`` helpers, which this module imports only inside
:func:`run_calibration`, so importing it (and ``hwprofiles``) stays torch-free.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from hwprofiles.errors import InputError

DEVICES = ("cpu", "cuda")


def _is_builtin_gpu(out: Path) -> bool:
    from hwprofiles.load import GPU_DIR

    return out.resolve().parent == GPU_DIR.resolve()


def default_node_path(out: Path) -> Path:
    """Where the node profile goes when not told: ``<out stem>-node.yaml`` next to ``out``, or in
    the built-in nodes folder when ``out`` is in the built-in GPU folder."""
    from hwprofiles.load import NODE_DIR

    name = f"{out.stem}-node.yaml"
    return NODE_DIR / name if _is_builtin_gpu(out) else out.with_name(name)


def gpu_reference(out: Path) -> str:
    """How the node profile names its GPU: the profile name if ``out`` is a built-in, else its path."""
    return out.stem if _is_builtin_gpu(out) else str(out.resolve())


def _check_inputs(device: str, out: Path, ranks: int, node_out: Optional[Path]) -> None:
    if device not in DEVICES:
        raise InputError(f"calibrate: --device: expected one of {', '.join(DEVICES)}, got {device!r}")
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise InputError(f"calibrate: --ranks: expected a positive integer, got {ranks!r}")
    for p, what in ((out, "-o"), (node_out, "--node-out")):
        if p is not None and p.suffix not in (".yaml", ".yml"):
            raise InputError(f"calibrate: {what} {p}: expected a .yaml path")
        if p is not None and p.exists() and p.is_dir():
            raise InputError(f"calibrate: {what} {p}: is a directory, expected a .yaml path")
    if node_out is not None and node_out.resolve() == out.resolve():
        raise InputError(f"calibrate: --node-out {node_out}: same file as -o")


def _check_cuda(ranks: int) -> None:
    import torch

    if not torch.cuda.is_available():
        raise InputError(f"calibrate: --device cuda: CUDA is not available (torch {torch.__version__}, "
                         f"{'no GPU visible' if torch.version.cuda else 'a CPU-only build'})")
    count = torch.cuda.device_count()
    if ranks > count:
        raise InputError(f"calibrate: --ranks {ranks}: only {count} CUDA device(s) visible (one rank per GPU)")


def run_calibration(device: str, out: Path, quick: bool = False, ranks: int = 2, progress: bool = True,
                    node_out: Optional[Path] = None) -> list[Path]:
    """Measure ``device`` and write its GPU profile to ``out`` (and, with ``ranks`` >= 2, the
    node profile to ``node_out``, default ``<stem>-node.yaml`` beside ``out``).

    Returns the files written. Bad input (unknown device, CUDA requested but absent, more
    ranks than GPUs, a non-YAML path) raises InputError with a one-line message.
    """
    out = Path(out)
    node_out = Path(node_out) if node_out is not None else None
    _check_inputs(device, out, ranks, node_out)
    if device == "cuda":
        _check_cuda(ranks)
    from hwprofiles.calibrate_run import measure

    calibration = measure(device, quick=quick, ranks=ranks, progress=progress)
    from hwprofiles.calibrate_write import write_profiles

    node_path = (node_out or default_node_path(out)) if calibration.link is not None else None
    return write_profiles(calibration, out, node_path, gpu_reference(out))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hwprofiles.calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=DEVICES, help="device to measure (default cpu)")
    p.add_argument("-o", "--out", required=True, type=Path, help="GPU profile to write (.yaml)")
    p.add_argument("--node-out", type=Path, default=None, help="node profile to write (default <stem>-node.yaml)")
    p.add_argument("--ranks", type=int, default=2, help="processes for the collectives (1: none; default 2)")
    p.add_argument("--quick", action="store_true", help="few shapes, short timings (well under a minute)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def main(argv: Optional[Sequence[str]] = None, run: Callable[..., list[Path]] = run_calibration) -> int:
    """Command line: exit 0 with the written paths on stdout, 2 on bad input."""
    args = _parser().parse_args(argv)
    try:
        written = run(args.device, args.out, quick=args.quick, ranks=args.ranks, progress=not args.no_progress,
                      node_out=args.node_out)
    except InputError as e:
        print(f"autoplan: error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
