"""``python -m autoplan`` and the ``autoplan`` command (pyproject.toml's entry point): the command
line (:mod:`autoplan.cli`), loaded inside a Ctrl-C handler so that an interrupt while its modules
load ends as one at any later moment does (:mod:`autoplan.interrupt`), not with a traceback."""

import gc
from typing import NoReturn

from autoplan import interrupt


def run() -> NoReturn:
    interrupt.install()
    gc.disable()  # loading makes hundreds of thousands of objects and few cycles: 15-20 ms of collections
    try:
        from autoplan import cli
    except KeyboardInterrupt:
        interrupt.leave(interrupt.report())
    finally:
        gc.enable()
    cli.run()


if __name__ == "__main__":
    run()
