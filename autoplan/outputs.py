"""Where the command line will write, checked before any work starts (docs/design.md section 3).

A search or a calibration can take minutes; a ``--plot``, ``--trace`` or ``-o`` that cannot be
written must stop the command at once with exit 2 (bad input), not after the work as an internal
error. And nothing the user wrote is replaced silently: ``emit`` refuses a run dir that already
holds files unless ``--force`` (then it says what it replaces).
"""

from __future__ import annotations

import os
from pathlib import Path

from hwprofiles.errors import InputError


def _writable_folder(folder: Path, what: str) -> None:
    if not folder.exists():
        raise InputError(f"{what}: the folder {folder} does not exist")
    if not folder.is_dir():
        raise InputError(f"{what}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{what}: cannot write in the folder {folder} (permission denied)")


def check_output_file(path: Path | None, flag: str) -> None:
    """``path`` can be written as a file: not a folder, in a folder that exists and is writable,
    and not a read-only file (InputError naming ``flag`` otherwise; None: nothing to check)."""
    if path is None:
        return
    what = f"{flag} {path}"
    if path.is_dir():
        raise InputError(f"{what}: is a folder (expected a file name)")
    _writable_folder(path.parent if str(path.parent) else Path("."), what)
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{what}: the file exists and cannot be written (permission denied)")


def check_run_dir(out_dir: Path, force: bool, flag: str = "-o") -> list[str]:
    """A run dir ``emit`` may write: new, or an empty folder, or (with ``force``) a folder that
    holds files; returns the names already there. Its parent must exist or be creatable."""
    what = f"{flag} {out_dir}"
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{what}: exists and is not a folder")
    if out_dir.is_dir():
        present = sorted(p.name for p in out_dir.iterdir())
        if present and not force:
            shown = ", ".join(present[:4]) + (", ..." if len(present) > 4 else "")
            raise InputError(
                f"{what}: the folder is not empty ({shown}); autoplan emit does not overwrite files: "
                "give another -o, or --force to replace the files it writes"
            )
        _writable_folder(out_dir, what)
        return present
    ancestor = out_dir.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    _writable_folder(ancestor, what)
    return []
