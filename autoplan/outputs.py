"""Where the command line will write, checked before any work starts (docs/design.md section 3).

A search or a calibration can take minutes; a ``--plot``, ``--trace`` or ``-o`` that cannot be
written must stop the command at once with exit 2 (bad input), not after the work as an internal
error. And nothing the user wrote is replaced silently: ``emit`` refuses a run dir that already
holds files unless ``--force`` (then it says what it replaces, and replaces a link to a file
elsewhere as a link); a picture or trace says which existing file it replaces; no output may be
an input of the command or another output.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from hwprofiles.errors import InputError

log = logging.getLogger(__name__)


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


def check_picture_file(path: Path | None, flag: str) -> None:
    """:func:`check_output_file`, and ``path``'s extension names a format matplotlib writes
    (``x.txt`` failed after the work; ``x`` was written as ``x.png``)."""
    if path is None:
        return
    check_output_file(path, flag)
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in kinds:
        raise InputError(f"{flag} {path}: give a picture file ending in one of ." + ", .".join(sorted(kinds)))


def check_distinct_outputs(outputs: dict[str, Path | None], inputs: Iterable[str | Path | None]) -> None:
    """No two of ``outputs`` (flag -> path) are one file, and none is one of the ``inputs`` files
    (model and cluster files; names of built-in profiles are not files): ``--trace model.yaml``
    replaced the model file, ``--plot`` and ``--trace`` on one path kept only the picture."""
    given = [(flag, path) for flag, path in outputs.items() if path is not None]
    for i, (flag, path) in enumerate(given):
        for other, other_path in given[:i]:
            if os.path.realpath(path) == os.path.realpath(other_path):
                raise InputError(f"{other} and {flag} name the same file {path}: give each its own")
        if not path.exists():
            continue
        for source in inputs:
            if source is not None and Path(source).is_file() and os.path.samefile(path, source):
                raise InputError(f"{flag} {path}: is an input of this command; give another file name")


def check_timeline_outputs(
    plot: Path | None, trace: Path | None, fidelity: str, inputs: Iterable[str | Path | None]
) -> None:
    """--plot and --trace of one job: a DES result to draw, and paths that can be written and are
    neither ``inputs`` nor each other, before the work."""
    if (plot or trace) and fidelity != "des":
        raise InputError("--plot and --trace need --fidelity des (the analytic estimate has no timeline)")
    check_picture_file(plot, "--plot")
    check_output_file(trace, "--trace")
    check_distinct_outputs({"--plot": plot, "--trace": trace}, inputs)


def warn_replacing(*paths: Path | None) -> None:
    """Say which existing files an output is about to replace (nothing the user wrote is replaced
    without a word)."""
    for path in paths:
        if path is not None and path.exists():
            log.warning("autoplan: replacing %s", path)


def check_run_dir(out_dir: Path, force: bool, flag: str = "-o") -> list[str]:
    """A run dir ``emit`` may write: a path its scripts can name (:func:`_check_run_dir_path`), new,
    or an empty folder, or (with ``force``) a folder that holds files; returns the names already
    there. Its parent must exist or be creatable."""
    try:
        _check_run_dir_path(out_dir, flag)
        return _run_dir_contents(out_dir, force, f"{flag} {out_dir}")
    except (OSError, RuntimeError) as e:  # a name too long for the file system, a loop of links
        raise InputError(f"{flag} {str(out_dir)[:80]!r}: {getattr(e, 'strerror', None) or e}") from None


def _check_run_dir_path(out_dir: Path, flag: str) -> None:
    """InputError for a run dir whose path the emitted scripts would read as another: a control
    character (the launchers find their folder with ``$(cd "$(dirname ...)" && pwd)``, and
    ``$(...)`` drops trailing newlines: "dir\\n" became its neighbour "dir"), or a ':' (the torchtitan
    launcher puts the run dir on PYTHONPATH, where ':' separates folders: "a:b" imported from "a")."""
    text = str(out_dir)
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise InputError(f"{flag} {text[:80]!r}: a control character ({bad!r}) in the run dir's path")
    if ":" in str(out_dir.resolve()):
        raise InputError(
            f"{flag} {text[:80]!r}: a ':' in the run dir's path (its launchers put it on PYTHONPATH, "
            "where ':' separates folders)"
        )


def _run_dir_contents(out_dir: Path, force: bool, what: str) -> list[str]:
    """The names in ``out_dir`` (none when it is new), after the checks of :func:`check_run_dir`."""
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
