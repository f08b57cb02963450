"""Write a calibration's profiles and check that they load (``hwprofiles.load``)."""

from __future__ import annotations

from pathlib import Path

from hwprofiles.calibrate.profile_text import render_gpu, render_node
from hwprofiles.calibrate.result import Calibration
from hwprofiles.load import build, load_gpu, load_node, node_from_mapping, read_yaml
from hwprofiles.schema import GpuProfile


def write_profiles(c: Calibration, out: Path, node_out: Path | None, gpu_ref: str) -> list[Path]:
    """Write the GPU profile to ``out`` and, when given, the node profile to ``node_out``.

    The GPU profile is named after ``out``'s stem, the node after ``node_out``'s. Both are read
    back through the loaders' validation; the loaders' caches are cleared first, since a
    profile of the same name or path may have been loaded (and cached) before this run.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_gpu(c, out.stem))
    written = [out]
    if node_out is not None:
        node_out.parent.mkdir(parents=True, exist_ok=True)
        node_out.write_text(render_node(c, node_out.stem, gpu_ref))
        written.append(node_out)
    load_gpu.cache_clear()
    load_node.cache_clear()
    build(GpuProfile, read_yaml(out), str(out))
    if node_out is not None:
        node_from_mapping(read_yaml(node_out), str(node_out))
    return written
