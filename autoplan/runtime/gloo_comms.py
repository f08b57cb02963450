"""FSDP2's all-gather and reduce-scatter as in-place all-reduces, for gloo groups.

Gloo's ``reduce_scatter_tensor`` runs at a third of its all-reduce's bus bandwidth
(hwprofiles/nodes/localhost-cpu.yaml: 0.44 against 1.26 GB/s), and it and
``all_gather_into_tensor`` leave transient buffers behind in the allocator: 4 gloo ranks on this
project's 2-core VM kept 27-53 and 13-23 MiB more anonymous memory after 60 calls on a 3.3 MiB
buffer, an in-place all-reduce 3-4 MiB, in about the same time (benchmarks/gloo_collective_probe.py,
torch 2.13, 2026-11-30). So on gloo autoplan's program gives FSDP2 these
(``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``), and the simulator prices
an all-reduce for each (simulator.runtime_spec.Runtime ``scatter_gather``):

* all-gather: FSDP2 copies this rank's shard into its slot of the output
  (``torch.ops.fsdp.all_gather_copy_in``); the rest is zeroed and the output all-reduced, whose
  sum is every rank's shard (x + 0 is exact);
* reduce-scatter: the input all-reduced in place with FSDP2's reduce op, and this rank's chunk
  copied out.

FSDP2 calls a comm's ``allocate`` and the comm itself (torch/distributed/fsdp/_fully_shard/
_fsdp_api.py ``AllGather``, ``ReduceScatter``: private classes, so these two follow their
interface without subclassing them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


class _Buffers:
    """FSDP2's comm buffers: plain tensors (the ``allocate`` both comm interfaces ask for)."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)


class AllReduceAllGather(_Buffers):
    """FSDP2's all-gather as an all-reduce of the output with the other ranks' slots zeroed."""

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, async_op: bool = False
    ) -> dist.Work | None:
        n, rank = input_tensor.numel(), dist.get_rank(group)
        flat = output_tensor.view(-1)
        flat[: rank * n].zero_()
        flat[(rank + 1) * n :].zero_()
        flat[rank * n : (rank + 1) * n].copy_(input_tensor.view(-1))  # FSDP2 copied it in: a no-op view copy
        return dist.all_reduce(output_tensor, group=group, async_op=async_op)


class AllReduceReduceScatter(_Buffers):
    """FSDP2's reduce-scatter as an in-place all-reduce of the input and a copy of this rank's chunk."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        async_op: bool = False,
    ) -> dist.Work | None:
        if async_op:
            raise ValueError("the all-reduce reduce-scatter copies its chunk out after the collective: async_op=False")
        dist.all_reduce(input_tensor, op=op, group=group)
        n, rank = output_tensor.numel(), dist.get_rank(group)
        output_tensor.view(-1).copy_(input_tensor.view(-1)[rank * n : (rank + 1) * n])
        return None
