"""How gradients and optimizer state are handled over the data-parallel group (which
mechanism a plan gets: ``autoplan.runtime.support.dp_mode``).

* ZeRO-2 / ZeRO-3: FSDP2 ``fully_shard`` over the dp mesh dimension, one unit per
  transformer layer plus the root; ZeRO-2 keeps parameters unsharded between forward and
  backward (``reshard_after_forward=False``), ZeRO-3 reshards them. ``offload=cpu`` adds
  ``CPUOffloadPolicy`` on GPU (on a CPU device the state already is in host memory, and FSDP2
  refuses the policy there: "Cannot access accelerator device when none is available").
  Composes with tensor parallelism (2-D) and pipelining. On gloo its reduce-scatters and
  all-gathers run as in-place all-reduces (``gloo_comms``).
* ZeRO-0 with TP or PP: a bucketed all-reduce of the local gradient shards after the last
  backward (``ManualGradAllReduce``); ZeRO-1 for any layout: ``zero1``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from autoplan.runtime.gloo_comms import AllReduceAllGather, AllReduceReduceScatter
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
    on_gloo = dist.get_backend() == "gloo"  # the program runs one backend
    for module in [*model.layers.values(), model]:
        unit = fully_shard(
            module, mesh=dp_mesh, reshard_after_forward=zero >= 3, mp_policy=mp, offload_policy=offload_policy
        )
        if on_gloo and hasattr(unit, "set_custom_all_gather"):  # its collectives as all-reduces: gloo_comms
            unit.set_custom_all_gather(AllReduceAllGather())  # type: ignore[arg-type]  # follows the private ABC
            unit.set_custom_reduce_scatter(AllReduceReduceScatter())  # type: ignore[arg-type]
        elif on_gloo:
            warnings.warn(
                f"torch {torch.__version__} has no FSDP2 custom collectives: gloo's reduce-scatters and all-gathers "
                "run as they are, where autoplan's prediction assumes all-reduces (autoplan.runtime.gloo_comms)",
                stacklevel=2,
            )


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


class HostGradients:
    """Offloaded FSDP2 gradients summed on the host between microbatches, where FSDP2 would copy
    them down to pageable memory.

    FSDP2 with ``CPUOffloadPolicy`` copies each microbatch's reduced gradient shard to the host.
    When the parameter already holds a gradient it copies synchronously into pageable memory
    so that it can add on the host (torch ``_fsdp_collectives.foreach_reduce``: ``non_blocking =
    pin_memory and not to_accumulate_grad``): 2.55 GB/s on an H100 VM, 86% of an offload step's
    GPU time (benchmarks/data/h100-2026-11-26b/offload-profile.txt). Taking each microbatch's
    gradients off the parameters (:meth:`take`) keeps every copy the pinned, asynchronous one
    FSDP2 overlaps with the backward (it waits for them in ``finalize_backward``); the sum runs
    here, one add per tensor on the host's threads, and :meth:`give_back` hands the summed
    gradients back for the norm and the host optimizer step."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.held: dict[nn.Parameter, torch.Tensor] = {}

    @torch.no_grad()
    def take(self) -> None:
        """Move the gradients of the microbatch just run into the held sums."""
        for p in self.params:
            grad = p.grad
            if grad is None:
                continue
            held = self.held.get(p)
            if held is None:
                self.held[p] = grad
            else:
                local(held).add_(local(grad))
            p.grad = None

    def give_back(self) -> None:
        """Set each parameter's gradient to its sum over the step's microbatches."""
        for p, grad in self.held.items():
            p.grad = grad
        self.held = {}
