"""How text from the inputs is written into the files ``autoplan emit`` writes (issue 31).

A config file is data: running or importing what autoplan wrote must never run anything else.
Names are held to a safe character set when they are loaded (:mod:`hwprofiles.names`); this
module is the second guard, so that a string that got past it (a Job built in code, a rule
widened later, a free-text note, the ``-o`` path) still cannot end a comment, a string or a line.
Each file kind takes input text through its own quoting only:

- comment lines (``#`` in shell scripts, Python, megatron_args.txt): :func:`comment_lines`, one
  line each (:func:`one_line`: no newline, carriage return, NUL or other control character, and
  every backslash doubled, so none can end a line or continue it);
- Python docstring lines: :func:`docstring_lines` (:func:`one_line` with ``"`` escaped: the text
  of a Python string literal, so ``\"\"\"`` cannot close the docstring);
- Python values: ``repr()``; JSON: ``json.dumps``;
- shell words: :func:`shell_word` (``shlex.quote``);
- ``#SBATCH`` values: :func:`slurm_word` (sbatch reads directive lines itself, splitting them at
  whitespace, and ``%x``, the job name, is expanded into the output file's path).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from hwprofiles.errors import InputError
from hwprofiles.names import NAME_CHARS, NAME_MAX


def printable(text: str) -> str:
    """``text`` with each non-printable character (newline, carriage return, tab, NUL, ESC, BEL,
    line and paragraph separators, bidirectional overrides: ``str.isprintable``) written as
    Python's ``repr`` escapes it (``\\n``, ``\\x1b``, ``\\u202e``): nothing in it can end a line or
    drive a terminal (the command line's error line, autoplan.cli)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(text: str) -> str:
    """``text`` as one line of printable characters: each backslash doubled, then
    :func:`printable`. It is also the body of a Python string literal with those escapes."""
    return printable(text.replace("\\", "\\\\"))


def comment_lines(lines: Iterable[str], prefix: str = "# ") -> str:
    """``lines`` as ``#`` comment lines, one each (:func:`one_line`), joined by newlines."""
    return "\n".join(prefix + one_line(line) for line in lines)


def docstring_lines(lines: Iterable[str]) -> str:
    """``lines`` for the inside of a ``\"\"\"`` docstring: one line each, as the body of a
    string literal (:func:`one_line`, and ``"`` escaped), joined by newlines."""
    return "\n".join(one_line(line).replace('"', '\\"') for line in lines)


def shell_word(text: str, what: str) -> str:
    """``text`` as one shell word (``shlex.quote``); ``what`` names it in the InputError that
    refuses a NUL, which no shell word can hold."""
    if "\x00" in text:
        raise InputError(f"{what}: a NUL character cannot be written into a shell script")
    return shlex.quote(text)


def slurm_word(text: str) -> str:
    """``text`` as the value of an ``#SBATCH`` directive: the name rule's characters
    (:data:`hwprofiles.names.NAME_CHARS`) except ``/`` kept, any other one written ``_``, at
    most :data:`hwprofiles.names.NAME_MAX` of them."""
    return "".join(c if c in NAME_CHARS and c != "/" else "_" for c in text[:NAME_MAX])
