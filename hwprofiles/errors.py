"""autoplan's one error type and its kinds, each with the exit code the command line returns.

It lives in the lowest package so that ``hwprofiles``, ``simulator`` and ``autoplan`` share it
without breaking the layering (imports go down only). The command line turns any
:class:`AutoplanError` into a one-line ``autoplan: error: ...`` message and exits with its
``exit_code`` (docs/design.md section 9, "Errors and exit codes").

    AutoplanError        exit 1   a failure that is not the user's input
    +-- InputError       exit 2   bad input: a file, key, value or option that cannot be used
    |   +-- SpecError    exit 2   a model, hardware profile or cluster file
    |   +-- PlanError    exit 2   a plan string or --fix that breaks a rule
    +-- FitError         exit 3   nothing fits: no plan of the search, or the given plan, fits memory
    +-- RunError         exit 1   a parallel run failed: a worker crashed, hung or wrote no results
"""

from __future__ import annotations


class AutoplanError(Exception):
    """Base of every error autoplan reports to the user. The message is one line."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class InputError(AutoplanError, ValueError):
    """Bad user input: a file, key, value or option that cannot be used."""

    exit_code = 2


class SpecError(InputError):
    """A model, hardware profile or cluster description that cannot be used."""


class PlanError(InputError):
    """A plan (``--plan``, ``--fix``) that breaks a divisibility or consistency rule."""


class FitError(AutoplanError):
    """Nothing fits: no plan of the search (or the given plan) fits the cluster's memory."""

    exit_code = 3


class RunError(AutoplanError, RuntimeError):
    """A parallel run failed: a worker crashed, hung, or wrote no results."""

    exit_code = 1
