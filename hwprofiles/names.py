"""The rule for names read from input files: models, GPUs, nodes and clusters (issue 31).

A name is a label, and it travels: into the header of every file ``autoplan emit`` writes (shell
and Python comments, a Python docstring, ``#SBATCH --job-name``, JSON), into the terminal, and
into plan.json, which ``autoplan run`` reads back. So it is held, when it is loaded, to characters
that no file kind treats specially:

    ASCII letters and digits, and  . _ + - /   (1 to 200 of them)

which admits every built-in name, a Hugging Face repo id (``meta-llama/Llama-3.1-8B``, the usual
``_name_or_path``) and a path, and refuses whitespace, quotes, ``$``, backticks, backslashes,
``#``, ``%``, control characters (newlines, NUL) and anything beyond ASCII. A name that breaks it is
a one-line :class:`~hwprofiles.errors.SpecError` naming the key, the character and its position.

The files quote what they show as well (:mod:`autoplan.emit.safe_text`), so the rule is the first
of two guards, not the only one.
"""

from __future__ import annotations

import string
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

NAME_CHARS = frozenset(string.ascii_letters + string.digits + "._+-/")
NAME_MAX = 200
NAME_RULE = f"letters, digits and . _ + - / only, 1 to {NAME_MAX} characters"


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot be a name (empty, longer than NAME_MAX, or a character outside
    NAME_CHARS: the first one, by its ``repr`` and position), or None when it can."""
    if not text:
        return f"a name cannot be empty ({NAME_RULE})"
    if len(text) > NAME_MAX:
        return f"a name of {len(text):,} characters is too long ({NAME_RULE})"
    at = next((i for i, c in enumerate(text) if c not in NAME_CHARS), None)
    if at is not None:
        return f"character {text[at]!r} at position {at + 1} is not allowed in a name ({NAME_RULE})"
    return None


def _checked(text: str) -> str:
    """The pydantic validator of :data:`Name`: ``text``, or a validation error with its problem."""
    problem = name_problem(text)
    if problem is not None:
        # the problem goes in as context: a template would read a '{' in it as a placeholder
        raise PydanticCustomError("name", "{problem}", {"problem": problem})
    return text


Name = Annotated[str, AfterValidator(_checked)]
"""A ``str`` field held to :func:`name_problem`'s rule when a profile or model is validated."""
