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

    autoplan calibrate --device cpu --ranks 4 \\
        -o hwprofiles/gpus/cpu.yaml --node-out hwprofiles/nodes/localhost-cpu.yaml

The one command line is ``autoplan calibrate`` (``autoplan.cli`` defines its options; this
package imports nothing from ``autoplan``, which sits above it).

Modules: ``run`` (every benchmark in order), ``settings`` (grids and timing budgets),
``timing``, ``ops`` (per-op overhead), ``gemm``, ``memory``, ``host`` (copies, host Adam,
device facts), ``eager`` (host time of eager blocks), ``comm`` (collectives in spawned ranks),
``ranks`` (what those ranks measure besides collectives: compute slots, the tensor-parallel
layer), ``wait`` (busy-core message wait), ``fit`` (numpy/scipy fits), ``result``, ``profile_text``
(the profiles' text) and ``write``. torch is imported by those modules, which this one imports
only inside :func:`run_calibration`, so importing it (and ``hwprofiles``) stays torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hwprofiles.errors import InputError

if TYPE_CHECKING:  # reference_layers imports torch, which this package's import avoids
    from hwprofiles.calibrate.reference_layers import LayerSplit

__all__ = ["DEVICES", "default_node_path", "gpu_reference", "run_calibration"]

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


def _check_inputs(device: str, out: Path, ranks: int, node_out: Path | None) -> None:
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
        raise InputError(
            f"calibrate: --device cuda: CUDA is not available (torch {torch.__version__}, "
            f"{'no GPU visible' if torch.version.cuda else 'a CPU-only build'})"
        )
    count = torch.cuda.device_count()
    if ranks > count:
        raise InputError(f"calibrate: --ranks {ranks}: only {count} CUDA device(s) visible (one rank per GPU)")


def run_calibration(
    device: str,
    out: Path,
    split_layer: LayerSplit,
    quick: bool = False,
    ranks: int = 2,
    progress: bool = True,
    node_out: Path | None = None,
) -> list[Path]:
    """Measure ``device`` and write its GPU profile to ``out`` (and, with ``ranks`` >= 2, the
    node profile to ``node_out``, default ``<stem>-node.yaml`` beside ``out``). ``split_layer``:
    how the program splits a layer over a tensor-parallel mesh (a picklable function: the ranks
    that time it are spawned; hwprofiles.calibrate.reference_layers.LayerSplit).

    Returns the files written. Bad input (unknown device, CUDA requested but absent, more
    ranks than GPUs, a non-YAML path) raises InputError with a one-line message.
    """
    out = Path(out)
    node_out = Path(node_out) if node_out is not None else None
    _check_inputs(device, out, ranks, node_out)
    if device == "cuda":
        _check_cuda(ranks)
    from hwprofiles.calibrate.run import measure

    calibration = measure(device, quick=quick, ranks=ranks, progress=progress, split_layer=split_layer)
    from hwprofiles.calibrate.write import write_profiles

    node_path = (node_out or default_node_path(out)) if calibration.link is not None else None
    return write_profiles(calibration, out, node_path, gpu_reference(out))
