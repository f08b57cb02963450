"""The ``notebooks`` section: execute every notebooks/*.ipynb top to bottom in a kernel of the checkout's venv and
write it back with its outputs, made stable to commit (fixed kernelspec, no timestamps, joined streams, machine
paths as labels, 256-colour PNGs)."""

from __future__ import annotations

import os
import re
import sys
import time

from .docs_runner import REPO, Docs, log, rel

NOTEBOOKS = REPO / "notebooks"
NOTEBOOK_DPI = 90  # inline matplotlib figures (the timeline pictures come as PNG files at simulator.des.plot's dpi)
NOTEBOOK_CELL_TIMEOUT_S = 600
MAX_NOTEBOOK_BYTES = 1_500_000
NOTEBOOK_KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
MKDTEMP_SUFFIX = re.compile(r"(/path/to/workdir/tmp/[A-Za-z0-9_.-]*?-)[a-z0-9_]{8}\b")


def _notebook_kernel(d: Docs):
    """An AsyncKernelManager for a ``python3`` kernelspec of the checkout's venv (sys.executable without one), written
    into the scratch folder and looked up only there: no other kernelspec on the machine can be picked up."""
    import json

    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.is_file() else sys.executable
    spec_dir = d.work / "kernels" / "python3"
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": NOTEBOOK_KERNELSPEC["display_name"],
                "language": "python",
                "metadata": {"debugger": False},
            }
        )
    )
    ksm = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ksm), python


def _shrink_png_b64(b64: str) -> str:
    """shrink_png for a notebook's base64 image/png output (kept as it is when it has transparency or grows)."""
    import base64
    import io

    from PIL import Image

    raw = base64.b64decode(b64)
    with Image.open(io.BytesIO(raw)) as im:
        if "A" in im.getbands() and im.getchannel("A").getextrema()[0] < 255:
            return b64
        q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    q.save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode("ascii") if buf.tell() < len(raw) else b64


def _label_paths(text: str, d: Docs) -> str:
    """Machine paths in a notebook's output as labels: the scratch folder (mkdtemp suffixes as XXXXXXXX), the checkout
    and its parent folder."""
    text = MKDTEMP_SUFFIX.sub(r"\1XXXXXXXX", d.clean_keep_lines(text))
    return text.replace(str(REPO), "/path/to/autoplan").replace(str(REPO.parent) + os.sep, "/path/to/")


def _tidy_notebook(nb, d: Docs) -> None:
    """Make an executed notebook stable to commit: fixed kernelspec, no timestamps, joined streams, small PNGs."""
    nb.metadata["kernelspec"] = dict(NOTEBOOK_KERNELSPEC)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("execution", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.outputs:
            if out.output_type == "stream":
                out.text = _label_paths(out.text, d)
                if outputs and outputs[-1].output_type == "stream" and outputs[-1].name == out.name:
                    outputs[-1].text += out.text  # one print split over several messages by the kernel's flushes
                    continue
            data = out.get("data", {})
            if "text/plain" in data:
                data["text/plain"] = _label_paths(data["text/plain"], d)
            if "image/png" in data:
                data["image/png"] = _shrink_png_b64(data["image/png"])
            outputs.append(out)
        cell.outputs = outputs


def execute_notebooks(d: Docs) -> None:
    """execute notebooks/*.ipynb in place and write them back with their outputs (not a README section)"""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not paths:
        raise SystemExit(f"make_docs: no notebooks in {NOTEBOOKS}")
    tmp = d.work / "tmp"  # the notebooks' tempfile.mkdtemp folders land in the scratch folder, removed at the end
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOPLAN_DEBUG", "MPLBACKEND")}
    env["TMPDIR"] = str(tmp)
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        km, python = _notebook_kernel(d)
        client = NotebookClient(
            nb,
            km=km,
            timeout=NOTEBOOK_CELL_TIMEOUT_S,
            record_timing=False,
            allow_errors=False,
            extra_arguments=[f"--InlineBackend.rc={{'figure.dpi': {NOTEBOOK_DPI}}}"],
            resources={"metadata": {"path": str(NOTEBOOKS)}},
        )
        t0 = time.perf_counter()
        try:
            client.execute(env=env)
        except CellExecutionError as e:  # the message holds the failing cell's source and traceback
            raise SystemExit(f"make_docs: {rel(path)} failed (left unchanged):\n{e}") from None
        _tidy_notebook(nb, d)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        if errors:
            raise SystemExit(
                f"make_docs: {rel(path)} has error outputs (left unchanged): {[(o.ename, o.evalue) for o in errors]}"
            )
        nbformat.validate(nb)
        text = nbformat.writes(nb)
        if len(text.encode()) > MAX_NOTEBOOK_BYTES:
            raise SystemExit(
                f"make_docs: {rel(path)} would be {len(text.encode()) / 1e6:.2f} MB, over the "
                f"{MAX_NOTEBOOK_BYTES / 1e6:.1f} MB limit (left unchanged)"
            )
        path.write_text(text if text.endswith("\n") else text + "\n")
        pngs = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        log(
            f"  {rel(path)}: {time.perf_counter() - t0:.1f} s with {python}, {pngs} picture(s), "
            f"{path.stat().st_size / 1e3:.0f} KB"
        )
