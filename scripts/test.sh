#!/usr/bin/env bash
# Set up, then run every check: lint and format (ruff), types (mypy), all tests (pytest).
# This is the README's test command; CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test,frameworks bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest -q --durations=25 "$@"
