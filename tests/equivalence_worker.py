"""One rank of a batch of tests/test_runtime_equivalence.py's cases (torchrun, gloo).

The process group starts once, and each run dir's check steps run in it one after the other
(``autoplan.runtime.train.run`` with ``own_group=False``). So a case does not pay for a torchrun
of its own and for its workers' imports: about 5 s of a 2-rank case and 9 s of a 4-rank case on
2 cores. A case that raises ends the batch: the traceback goes to stderr, and the cases after it
write no results.

    python -m torch.distributed.run --standalone --nproc-per-node W equivalence_worker.py RUN_DIR...
"""

from __future__ import annotations

import datetime
import sys

import torch.distributed as dist

from autoplan.runtime import train

CHECK_STEPS = 3


def main(run_dirs: list[str]) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    for run_dir in run_dirs:
        argv = ["--run-dir", run_dir, "--steps", "0", "--check-steps", str(CHECK_STEPS), "--device", "cpu"]
        train.run(train.parse_args(argv), own_group=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
