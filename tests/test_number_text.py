"""Numbers typed by a user are ASCII decimals (hwprofiles.number_text): Python's int() and
float() also read full-width digits, underscores and the words inf and nan."""

from __future__ import annotations

import pytest

from hwprofiles.number_text import parse_decimal, parse_integer


@pytest.mark.parametrize("text,value", [("8", 8), (" 1536 ", 1536), ("-1", -1), ("+2", 2), ("007", 7)])
def test_an_integer_of_ascii_digits_is_read(text: str, value: int) -> None:
    assert parse_integer(text) == value


@pytest.mark.parametrize("text", ["\uff18", "1_008", "\u0668"])  # full-width 8, Arabic-Indic 8
def test_what_int_reads_beyond_ascii_digits_is_refused(text: str) -> None:
    assert int(text) in (8, 1008)
    with pytest.raises(ValueError, match="expected an integer"):
        parse_integer(text)


@pytest.mark.parametrize("text", ["1.0", "1e3", "", " ", "0x10", "eight"])
def test_anything_else_is_not_an_integer(text: str) -> None:
    with pytest.raises(ValueError, match="expected an integer"):
        parse_integer(text)


@pytest.mark.parametrize(
    "text,value", [("2e12", 2e12), ("300e9", 3e11), ("0.5", 0.5), (".5", 0.5), ("1.5E-3", 1.5e-3), ("3.", 3.0)]
)
def test_a_decimal_is_read(text: str, value: float) -> None:
    assert parse_decimal(text) == value


@pytest.mark.parametrize("text", ["inf", "nan", "infinity", "1_000", "\uff11e3", "1e", "e3", ".", "1e999"])
def test_words_underscores_wide_digits_and_overflow_are_not_decimals(text: str) -> None:
    with pytest.raises(ValueError, match="expected a number"):
        parse_decimal(text)
