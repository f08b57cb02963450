"""Regenerate everything README.md shows from the current code.

    .venv/bin/python scripts/make_docs.py                 # every section and picture (about 3-4 minutes on 2 cores)
    .venv/bin/python scripts/make_docs.py --only plan-output,gallery-what-if
    .venv/bin/python scripts/make_docs.py --list          # the section names
    .venv/bin/python scripts/make_docs.py --only notebooks  # re-execute notebooks/*.ipynb in place (about 3 minutes)

Every command output in the README sits between a pair of markers,

    <!-- BEGIN: plan-output -->
    ...
    <!-- END: plan-output -->

and this script replaces what lies between them with the real output of the command it runs (``python -m autoplan``
of this checkout, shown as ``autoplan``). Files the README quotes (a model YAML, node and GPU profiles) are copied
in the same way. The gallery pictures go to ``docs/images/*.png``, re-encoded as 256-colour PNGs to stay small.
A marker in README.md without a generator here (or the reverse) is an error, so the two cannot drift apart.

Command outputs are run in a scratch folder (so ``runs/`` and calibration files do not land in the checkout); its
absolute path is shown as ``/path/to/workdir``.

The ``notebooks`` section is not a README section: it executes every ``notebooks/*.ipynb`` top to bottom (nbclient,
``notebooks/`` as the working directory, a ``python3`` kernel of the checkout's ``.venv``) and writes it back with its
outputs, so that the notebooks read on GitHub with their tables and pictures. Volatile metadata (execution
timestamps) is dropped, split stream outputs are joined, inline figures are drawn at NOTEBOOK_DPI and every PNG is
re-encoded as a 256-colour PNG; the kernel's temporary folder is the scratch folder, shown as ``/path/to/workdir``
(and the checkout as ``/path/to/autoplan``).
``tests/test_notebooks.py`` fails when a committed notebook's outputs no longer match what its cells produce (in
structure: output kinds and picture counts per cell), so rerun this section after changing a notebook or what it shows.

This file holds the section table (in README order) and the driver; the generators live in
``scripts/make_docs_sections/``, one file per kind of section (see its ``__init__``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from make_docs_sections.command_outputs import (
    accuracy_stacks,
    calibrate_output,
    cluster_sizing,
    emit_launch,
    emit_output,
    emit_slurm,
    gpu_compare,
    long_context,
    modern_plan,
    moe_plan,
    plan_frameworks,
    plan_output,
    run_output,
    simulate_json,
    simulate_output,
)
from make_docs_sections.docs_runner import IMAGES, REPO, Docs, log
from make_docs_sections.gallery_fsdp import gallery_fsdp
from make_docs_sections.gallery_validation import gallery_validation
from make_docs_sections.gallery_what_if import gallery_what_if
from make_docs_sections.input_files import cluster_example, hf_config_example, quoted_file
from make_docs_sections.notebooks import execute_notebooks

README = REPO / "README.md"
MARKER = re.compile(r"<!-- BEGIN: ([a-z0-9-]+) -->\n(.*?)<!-- END: \1 -->", re.S)

SECTIONS: dict[str, Callable[[Docs], str]] = {
    "plan-output": plan_output,
    "plan-frameworks": plan_frameworks,
    "accuracy-stacks": accuracy_stacks,
    "modern-plan": modern_plan,
    "long-context": long_context,
    "moe-plan": moe_plan,
    "cluster-sizing": cluster_sizing,
    "simulate-output": simulate_output,
    "simulate-json": simulate_json,
    "gallery-what-if": gallery_what_if,
    "gallery-validation": gallery_validation,
    "gallery-fsdp": gallery_fsdp,
    "model-yaml": quoted_file("autoplan/models/gpt3-175b.yaml"),
    "hf-config": hf_config_example,
    "gpu-yaml": quoted_file("hwprofiles/gpus/a100-sxm4-80gb.yaml"),
    "node-yaml": quoted_file("hwprofiles/nodes/dgx-a100-80gb.yaml"),
    "cluster-example": cluster_example,
    "emit-output": emit_output,
    "emit-launch": emit_launch,
    "emit-slurm": emit_slurm,
    "run-output": run_output,
    "calibrate-output": calibrate_output,
    "gpu-compare": gpu_compare,
}

NOTEBOOK_SECTIONS: dict[str, Callable[[Docs], None]] = {"notebooks": execute_notebooks}


def check_markers(readme: str) -> None:
    """Stop unless README.md has exactly one marker pair per README section and none without a generator."""
    names = [n for n, _ in MARKER.findall(readme)]
    missing = [n for n in SECTIONS if n not in names]
    unknown = [n for n in names if n not in SECTIONS]
    if missing or unknown or len(set(names)) != len(names):
        raise SystemExit(
            f"make_docs: README markers and generators differ: no marker for {missing}, "
            f"no generator for {unknown}, duplicates {sorted({n for n in names if names.count(n) > 1})}"
        )


def fill(readme: str, bodies: dict[str, str]) -> str:
    """``readme`` with the text between each section's markers replaced by its body in ``bodies`` (others kept)."""

    def sub(m: re.Match) -> str:
        name = m.group(1)
        body = bodies.get(name, m.group(2))
        return f"<!-- BEGIN: {name} -->\n{body.rstrip()}\n<!-- END: {name} -->"

    return MARKER.sub(sub, readme)


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections in a scratch folder, then write their bodies into README.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated section names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the sections and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    a = ap.parse_args(argv)
    if a.list:
        for name, fn in {**SECTIONS, **NOTEBOOK_SECTIONS}.items():
            print(f"{name:20} {(fn.__doc__ or '').strip().splitlines()[0] if fn.__doc__ else ''}")
        return 0
    check_markers(README.read_text())
    only = [s for s in a.only.split(",") if s]
    bad = [s for s in only if s not in SECTIONS and s not in NOTEBOOK_SECTIONS]
    if bad:
        raise SystemExit(f"make_docs: unknown section(s) {bad} (see --list)")
    IMAGES.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="autoplan-docs-"))
    t0 = time.perf_counter()
    bodies: dict[str, str] = {}
    try:
        d = Docs(work)
        for name, gen in SECTIONS.items():
            if only and name not in only:
                continue
            log(f"[{name}]")
            bodies[name] = gen(d)
        for name, run_notebooks in NOTEBOOK_SECTIONS.items():
            if only and name not in only:
                continue
            log(f"[{name}]")
            run_notebooks(d)
    finally:
        if a.keep:
            log(f"scratch folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if bodies:  # re-read: the sections take minutes, and README.md may have been edited meanwhile
        README.write_text(fill(README.read_text(), bodies))
    sizes = {p.name: p.stat().st_size for p in sorted(IMAGES.glob("*.png"))}
    log(
        f"updated {len(bodies)} README section(s) in {time.perf_counter() - t0:.0f} s; images: "
        + ", ".join(f"{k} {v / 1e3:.0f} KB" for k, v in sizes.items())
        + f" (total {sum(sizes.values()) / 1e3:.0f} KB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
