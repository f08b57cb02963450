"""Ctrl-C on the command line (autoplan.interrupt): one line and exit 130 however it lands."""

from __future__ import annotations

import signal

import pytest

from autoplan import cli, interrupt

PLAN = ["plan", "--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8"]


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's SIGINT handler, put back as it was afterwards."""
    monkeypatch.setattr(interrupt, "_interrupted", type(interrupt._interrupted)())
    before = signal.getsignal(signal.SIGINT)
    interrupt.install()
    yield
    signal.signal(signal.SIGINT, before)


class _DropsAnInterrupt:
    """An object whose finalizer gets a SIGINT: the interpreter reports the KeyboardInterrupt raised
    there ("Exception ignored in ...") and goes on, as at an at-fork or import-lock callback."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped one, expected
def test_a_ctrl_c_the_interpreter_drops_still_ends_the_command(installed, monkeypatch, capsys):
    def command(_args: object) -> int:
        _DropsAnInterrupt()  # made and dropped at once: its finalizer runs here
        return 0

    monkeypatch.setitem(cli.HANDLERS, "plan", command)
    assert cli.main(PLAN) == interrupt.EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err.endswith("autoplan: error: interrupted\n")


def test_an_error_a_ctrl_c_caused_is_reported_as_the_interrupt(installed, monkeypatch, capsys):
    """A library that wraps the KeyboardInterrupt in its own error (pydantic's schema build does)
    gives one line, the interrupt's, not an internal error."""

    def command(_args: object) -> int:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt as e:
            raise RuntimeError(f"schema error: {e!r}") from e
        return 0

    monkeypatch.setitem(cli.HANDLERS, "plan", command)
    assert cli.main(PLAN) == 130
    assert capsys.readouterr().err == "autoplan: error: interrupted\n"


def test_without_a_ctrl_c_the_command_ends_as_it_returns(installed, monkeypatch):
    monkeypatch.setitem(cli.HANDLERS, "plan", lambda _args: 3)
    assert cli.main(PLAN) == 3 and not interrupt.interrupted()
