"""The project's size rules for its source: no file over MAX_FILE_LINES lines and no function
(or method, nested or not) over MAX_FUNCTION_LINES lines, counted from its ``def`` line to its
last line, docstring included (decorators not counted). Every violation is named at once."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
#: the folders of the project's source (tests/ and the virtual environment are not walked)
SOURCE_DIRS = ("autoplan", "simulator", "hwprofiles", "scripts", "benchmarks")


def source_files() -> list[Path]:
    """Every Python file under :data:`SOURCE_DIRS`, in path order."""
    return sorted(path for folder in SOURCE_DIRS for path in (REPO / folder).rglob("*.py"))


def long_functions(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(name, first line, length in lines) of each function of ``tree`` over MAX_FUNCTION_LINES."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append((node.name, node.lineno, length))
    return sorted(found, key=lambda f: f[1])


def test_source_is_walked():
    files = {path.relative_to(REPO).as_posix() for path in source_files()}
    assert "autoplan/cli.py" in files and "simulator/des/simulate.py" in files
    assert not any(f.startswith(("tests/", ".venv/")) for f in files)


def test_no_file_over_the_line_limit():
    over = []
    for path in source_files():
        lines = len(path.read_text().splitlines())
        if lines > MAX_FILE_LINES:
            over.append(f"{path.relative_to(REPO).as_posix()}: {lines} lines")
    assert not over, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(over)


def test_no_function_over_the_line_limit():
    over = []
    for path in source_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        over += [
            f"{path.relative_to(REPO).as_posix()}:{line} {name}: {length} lines"
            for name, line, length in long_functions(tree)
        ]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)
