"""The collectives of tensor and sequence parallelism, as autograd functions on plain tensors.

Each is one of Megatron-LM's mappings (megatron/core/tensor_parallel/mappings.py), named as
there, over one tensor-parallel process group:

| function | forward | backward |
|---|---|---|
| :func:`copy_to_group` | identity | all-reduce (sum) |
| :func:`reduce_from_group` | all-reduce (sum) | identity |
| :func:`scatter_to_sequence` | this rank's chunk of the sequence | all-gather along the sequence |
| :func:`gather_from_sequence` | all-gather along the sequence | reduce-scatter, or this rank's chunk |
| :func:`reduce_scatter_to_sequence` | reduce-scatter along the sequence | all-gather along the sequence |

The sequence is dim 1 of a (batch, sequence, hidden) activation, split into t equal chunks
(sequence parallelism needs t to divide it: autoplan.runtime.support). A collective runs on the
sequence-first copy of the tensor, where each rank's chunk is contiguous, and hands back a
contiguous batch-first tensor: with b > 1 a batch-first view of its output is not contiguous,
and each Linear reading it (q, k and v; fc1 and the gate) would copy it and keep its own copy
for the backward, where one copy serves them all.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

Group = dist.ProcessGroup


def _all_gather_sequence(x: torch.Tensor, group: Group) -> torch.Tensor:
    front = x.movedim(1, 0).contiguous()
    out = front.new_empty((front.shape[0] * dist.get_world_size(group), *front.shape[1:]))
    dist.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, 1).contiguous()


def _reduce_scatter_sequence(x: torch.Tensor, group: Group) -> torch.Tensor:
    front = x.movedim(1, 0).contiguous()
    out = front.new_empty((front.shape[0] // dist.get_world_size(group), *front.shape[1:]))
    dist.reduce_scatter_tensor(out, front, group=group)
    return out.movedim(0, 1).contiguous()


def _own_chunk(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x.chunk(dist.get_world_size(group), dim=1)[dist.get_rank(group)].contiguous()


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        dist.all_reduce(x, group=group)  # in place: x is a fresh partial result (a lookup's, a GEMM's)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _ToSequenceChunk(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, summed: bool) -> torch.Tensor:
        ctx.group = group
        return _reduce_scatter_sequence(x, group) if summed else _own_chunk(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather_sequence(grad, ctx.group), None, None


class _GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, grad_is_partial: bool) -> torch.Tensor:
        ctx.group, ctx.grad_is_partial = group, grad_is_partial
        return _all_gather_sequence(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.grad_is_partial:
            return _reduce_scatter_sequence(grad, ctx.group), None, None
        return _own_chunk(grad, ctx.group), None, None


def copy_to_group(x: torch.Tensor, group: Group) -> torch.Tensor:
    """``x`` unchanged; its gradient summed over ``group`` (the input of column-parallel GEMMs)."""
    return _CopyToGroup.apply(x, group)


def reduce_from_group(x: torch.Tensor, group: Group) -> torch.Tensor:
    """``x`` summed over ``group`` in place; the gradient passed through (after row-parallel GEMMs
    and the split embedding's lookups)."""
    return _ReduceFromGroup.apply(x, group)


def scatter_to_sequence(x: torch.Tensor, group: Group) -> torch.Tensor:
    """This rank's chunk of the replicated ``x``'s sequence; the gradient all-gathered."""
    return _ToSequenceChunk.apply(x, group, False)


def gather_from_sequence(x: torch.Tensor, group: Group, grad_is_partial: bool) -> torch.Tensor:
    """The whole sequence from each rank's chunk. The gradient is reduce-scattered when each rank
    holds a partial sum of it (``grad_is_partial``: column-parallel GEMMs follow), else cut to this
    rank's chunk (every rank holds all of it)."""
    return _GatherFromSequence.apply(x, group, grad_is_partial)


def reduce_scatter_to_sequence(x: torch.Tensor, group: Group) -> torch.Tensor:
    """This rank's chunk of the sequence of ``x`` summed over ``group``; the gradient all-gathered
    (after row-parallel GEMMs under sequence parallelism)."""
    return _ToSequenceChunk.apply(x, group, True)
