"""What the DeepSpeed tests change so DeepSpeed's engine starts quickly on a CPU-only machine.

DeepSpeed's CPU accelerator compiles C++ ops with g++ the first time they are used. On a fresh
machine such as CI's, each compile takes about 40-50 s on 2 cores:

* ``deepspeed_shm_comm``: ``deepspeed.comm``'s shared-memory all-reduce for CPU ranks,
  built by ``init_distributed`` (deepspeed/comm/torch.py ``build_shm_op``, DeepSpeed 0.19.8);
* ``pin_memory``: built by the NVMe swapper before it fails on the missing libaio
  (deepspeed/ops/op_builder/cpu/async_io.py).

Neither op is in what the tests check: the engines, groups and optimizers DeepSpeed builds from
the emitted files, which a GPU user's run builds without them.
"""

from __future__ import annotations

import deepspeed.ops


def without_shm_comm() -> None:
    """Turn off DeepSpeed's shared-memory CPU all-reduce, so its C++ op is not compiled.

    ``init_distributed`` builds the op only when ``deepspeed.ops.__compatible_ops__`` marks it
    compatible. DeepSpeed caches that dict in the module so that edits to it persist
    (deepspeed/ops/__init__.py). With the op off, collectives run on torch's own backend (gloo,
    or the fake process group)."""
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def nvme_refusal() -> str | None:
    """Why an NVMe-offloading engine cannot start here, or None where it can.

    DeepSpeed's async_io op needs libaio, and this machine may lack it
    (deepspeed/ops/op_builder/async_io.py ``is_compatible``)."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if AsyncIOBuilder().is_compatible(verbose=False):
        return None
    return "DeepSpeed's async_io op (libaio) does not build on this machine"
