"""``python -m hwprofiles.calibrate ARGS``: the same command as ``autoplan calibrate ARGS``.

The options are defined once, by ``autoplan.cli``'s ``calibrate`` subcommand; this only hands
the arguments to it. A script entry point, never imported by the package: importing
``hwprofiles`` or ``hwprofiles.calibrate`` imports neither ``autoplan`` nor torch.
"""

from __future__ import annotations

import sys


def main() -> int:
    from autoplan.cli import main as autoplan_main

    return autoplan_main(["calibrate", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
