"""The node counts of ``autoplan plan --nodes``: ``N``, ``A:B`` (every count from A to B),
``A:B:S`` (from A to B in steps of S) or ``A,B,C``."""

from __future__ import annotations

from hwprofiles.errors import InputError
from hwprofiles.number_text import parse_integer

#: the most sizes one sweep plans (each is a whole search)
MAX_SIZES = 1024


def parse_node_counts(text: str) -> list[int]:
    """The node counts ``text`` names, ascending and distinct; InputError (one line) otherwise."""
    text = text.strip()
    try:
        parts = [parse_integer(x) for x in text.split(":" if ":" in text else ",")]
    except ValueError:
        raise InputError(f"--nodes {text!r}: expected a node count N, a range A:B or A:B:S, or a list A,B,C") from None
    if ":" in text:
        if len(parts) not in (2, 3) or parts[0] > parts[1] or (len(parts) == 3 and parts[2] < 1):
            raise InputError(f"--nodes {text}: expected A:B or A:B:S with A <= B and S >= 1")
        step = parts[2] if len(parts) == 3 else 1
        _check_size_count(text, (parts[1] - parts[0]) // step + 1)  # before the range is built: 1:10**12 is a count
        counts = list(range(parts[0], parts[1] + 1, step))
    else:
        counts = parts
    if min(counts) < 1:
        raise InputError(f"--nodes {text}: node counts must be at least 1")
    counts = sorted(set(counts))
    _check_size_count(text, len(counts))
    return counts


def _check_size_count(text: str, n: int) -> None:
    """InputError when ``--nodes text`` names more than :data:`MAX_SIZES` sizes."""
    if n > MAX_SIZES:
        raise InputError(f"--nodes {text}: {n:,} sizes, at most {MAX_SIZES} per sweep (use a step, A:B:S)")
