"""What every make_docs section shares: the scratch folder and the ``autoplan`` commands run in it (class Docs),
the README's code fences, progress lines on stderr and the 256-colour PNG re-encoding of the pictures."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "docs" / "images"
MAX_PNG_BYTES = 300_000
WORKDIR_LABEL = "/path/to/workdir"


class Docs:
    """Shared state: the scratch folder and what earlier sections found (the best plan string)."""

    def __init__(self, work: Path):
        self.work = work
        self.best_plan: str | None = None
        self.last_stderr = ""  # the last command's stderr (emit prints its per-tool summary there)
        self.last_code = 0

    def autoplan(
        self, *args: str, cwd: Path | None = None, timeout: float = 900, allowed: tuple[int, ...] = (0,)
    ) -> tuple[str, str]:
        """Run ``python -m autoplan ARGS``; return (the command as shown, stdout). An exit code not in
        ``allowed`` stops the script; the code is ``last_code``, stderr ``last_stderr``."""
        cwd = cwd or self.work
        env = {k: v for k, v in os.environ.items() if k != "AUTOPLAN_DEBUG"}
        env["COLUMNS"] = "200"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "autoplan", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        shown = "$ autoplan " + " ".join(args)
        log(f"  {shown}  [exit {proc.returncode}, {time.perf_counter() - t0:.1f} s]")
        self.last_code = proc.returncode
        if proc.returncode not in allowed:
            raise SystemExit(f"make_docs: '{shown}' failed with exit code {proc.returncode}:\n{proc.stderr.strip()}")
        self.last_stderr = self.clean(proc.stderr)
        return shown, self.clean(proc.stdout)

    def clean(self, text: str) -> str:
        """Command output as the README shows it: the scratch folder as /path/to/workdir, no trailing blanks."""
        text = text.replace(str(self.work.resolve()), WORKDIR_LABEL).replace(str(self.work), WORKDIR_LABEL)
        return "\n".join(line.rstrip() for line in text.rstrip().splitlines())

    def clean_keep_lines(self, text: str) -> str:
        """The scratch folder shown as /path/to/workdir, nothing else changed (for notebook outputs)."""
        return text.replace(str(self.work.resolve()), WORKDIR_LABEL).replace(str(self.work), WORKDIR_LABEL)


def log(msg: str) -> None:
    """A progress line on stderr (stdout stays free for --list)."""
    print(msg, file=sys.stderr, flush=True)


def fence(body: str, lang: str = "text") -> str:
    """``body`` as a Markdown code block in ``lang``."""
    return f"```{lang}\n{body.rstrip()}\n```\n"


def shrink_png(path: Path) -> int:
    """Re-encode as a 256-colour palette PNG (the pictures are flat-colour charts); return the new size."""
    from PIL import Image

    with Image.open(path) as im:
        q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    q.save(path, optimize=True)
    size = path.stat().st_size
    if size > MAX_PNG_BYTES:
        raise SystemExit(f"make_docs: {path} is {size / 1e3:.0f} KB, over the {MAX_PNG_BYTES / 1e3:.0f} KB limit")
    return size


def rel(path: Path) -> str:
    """``path`` relative to the checkout, as the README shows it."""
    return str(path.relative_to(REPO))
