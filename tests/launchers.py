"""Run an emitted launch script as a node would, with a stand-in ``torchrun`` that records the
arguments it was given instead of starting processes (the export tests of Megatron-LM and
torchtitan: what the tool's own argument parser then receives)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

STAND_IN_TORCHRUN = """#!/usr/bin/env bash
# a stand-in torchrun: writes the arguments it was given, one per line, to $ARGV_OUT
printf '%s\\n' "$@" > "$ARGV_OUT"
"""


def launched_argv(files: dict[str, str], script: str, tmp: Path, after: str, **env: str) -> tuple[int, list[str], str]:
    """Write ``files`` into ``tmp/run`` and run ``script`` there with the stand-in torchrun first on
    the PATH (and MASTER_ADDR set, for multi-node plans): (its exit code, the arguments torchrun got
    after the ``after`` one (the program they are for), its stderr)."""
    run_dir, bin_dir = tmp / "run", tmp / "bin"
    run_dir.mkdir(exist_ok=True)
    bin_dir.mkdir(exist_ok=True)
    for name, text in files.items():
        (run_dir / name).write_text(text)
    (bin_dir / "torchrun").write_text(STAND_IN_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    out = tmp / "argv.txt"
    out.unlink(missing_ok=True)
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "ARGV_OUT": str(out), "MASTER_ADDR": "node0"}
    done = subprocess.run(
        ["bash", str(run_dir / script)], env={**base, **env}, capture_output=True, text=True, timeout=30
    )
    argv = out.read_text().splitlines() if out.is_file() else []
    return done.returncode, argv[argv.index(after) + 1 :] if argv else [], done.stderr
