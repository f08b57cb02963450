"""How gradients and optimizer state are handled over the data-parallel group (which
mechanism a plan gets: ``autoplan.runtime.support.dp_mode``).

* ZeRO-2 / ZeRO-3: FSDP2 ``fully_shard`` over the dp mesh dimension, one unit per
  transformer layer plus the root; ZeRO-2 keeps parameters unsharded between forward and
  backward (``reshard_after_forward=False``), ZeRO-3 reshards them. ``offload=cpu`` adds
  ``CPUOffloadPolicy`` on GPU (on a CPU device the state already is in host memory, and FSDP2
  refuses the policy there: "Cannot access accelerator device when none is available").
  Composes with tensor parallelism (2-D) and pipelining.
* ZeRO-0 with TP or PP: a bucketed all-reduce of the local gradient shards after the last
  backward (``ManualGradAllReduce``); ZeRO-1 for any layout: ``zero1``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from autoplan.runtime.model import GPT
from hwprofiles.units import MiB

BUCKET_BYTES = 25 * MiB


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores: a DTensor's local shard, else the tensor itself."""
    return t._local_tensor if isinstance(t, DTensor) else t


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh, zero: int, offload: bool, param_dtype: torch.dtype | None) -> None:
    """FSDP2 over the data-parallel mesh: each transformer layer, then the chunk's root."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype
        else MixedPrecisionPolicy()
    )
    offload_policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    for module in [*model.layers.values(), model]:
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=zero >= 3, mp_policy=mp, offload_policy=offload_policy)


def buckets(tensors: list[torch.Tensor], cap: int = BUCKET_BYTES) -> Iterable[list[torch.Tensor]]:
    """Consecutive groups of same-dtype tensors of at most ``cap`` bytes (one tensor may exceed it)."""
    group: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if group and (size + nbytes > cap or t.dtype != group[0].dtype):
            yield group
            group, size = [], 0
        group.append(t)
        size += nbytes
    if group:
        yield group


@torch.no_grad()
def all_reduce_mean(tensors: list[torch.Tensor], group: dist.ProcessGroup, size: int) -> None:
    """Average ``tensors`` in place over ``group`` with one all-reduce per bucket."""
    for bucket in buckets(tensors):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for t, s in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(s)


class ManualGradAllReduce:
    """ZeRO-0 data parallelism for TP/PP: average the local gradient shards over dp."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup, size: int):
        self.params, self.group, self.size = params, group, size

    def __call__(self) -> None:
        grads = [local(p.grad) for p in self.params if p.grad is not None]
        all_reduce_mean(grads, self.group, self.size)
