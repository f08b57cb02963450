"""The command line's own documentation: --version, a help text for every option, every built-in
model named in --help and the README, and the README's walk-through following the main job's winner."""

from __future__ import annotations

import argparse
import re

import pytest
from conftest import REPO

from autoplan import __version__
from autoplan.cli import build_parser
from simulator.model_files import builtin_models
from simulator.plan import parse_plan_items, resolve_plan

README = (REPO / "README.md").read_text()


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """The root parser and each command's, by name."""
    root = build_parser()
    found = {"autoplan": root}
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"autoplan {__version__}\n"


@pytest.mark.parametrize("name", list(_parsers()))
def test_every_option_has_a_help_text(name):
    parser = _parsers()[name]
    missing = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction) and a.help in (None, "", argparse.SUPPRESS)
    ]
    assert not missing, f"{name}: options without help: {missing}"


def test_every_builtin_model_is_named_in_help_and_readme():
    models = builtin_models()
    assert "mixtral-8x7b" in models and "tiny" in models
    for text, where in ((build_parser().format_help(), "autoplan --help"), (README, "README.md")):
        assert not [m for m in models if m not in text], where
    for name in ("plan", "simulate", "emit"):
        assert all(m in _parsers()[name].format_help() for m in models), name


def _plan(text: str):
    return resolve_plan(parse_plan_items(text), 1024)


def test_how_it_works_follows_the_main_jobs_winner():
    """The walk-through names the plan the README's main-job output (generated) reports."""
    output = README.split("<!-- BEGIN: plan-output -->", 1)[1].split("<!-- END: plan-output -->", 1)[0]
    winner = re.search(r"^plan string: (\S+)$", output, re.M)
    walk = README.split("## How it works", 1)[1]
    named = re.search(r"the main job's winner\s+`([^`]+)`", walk)
    assert winner and named
    assert _plan(named.group(1)) == _plan(winner.group(1))
