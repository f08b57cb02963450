"""ZeRO-1 as Megatron-LM's distributed optimizer: reduce-scatter the gradients, all-gather the parameters.

A rank's local parameter values (their DTensor shards under TP) lie end to end in one flat
buffer of N values, padded to a multiple of the data-parallel size d; data-parallel rank r
owns the contiguous shard [r*N/d, (r+1)*N/d). After backward every rank flattens its
gradients into the buffer and one reduce-scatter (sum, then / d) leaves it the averaged
gradient of its shard; its optimizer holds state for those N/d values only and updates a
master copy of the shard; one all-gather into the same buffer gives every rank all updated
values, copied back into the parameters: a reduce-scatter of the gradients and an all-gather of
the parameters (Rajbhandari et al. 2020, P_os), for any layout, with or without TP and PP.

On gloo both collectives are all-reduces of the buffer in place (simulator.runtime_spec.Runtime
``scatter_gather`` "all-reduce", which prices them): the gradients' sum, of which a rank keeps its shard
(its master copy's gradient is a view of the buffer), and after the step the buffer with every
other rank's shard zeroed, whose sum is every rank's updated shard (x + 0 is exact). Gloo's
reduce-scatter runs at a third of its all-reduce's bandwidth, and its reduce-scatter and
all-gather leave tens of MiB of transient buffers in the allocator at a few MiB of parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from autoplan.runtime.data_parallel import local

# torch 2.13 renamed the flat collectives; older releases only have the first names
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Piece:
    """Where parameter ``index`` overlaps this rank's shard: ``length`` values from
    ``param_start`` in the parameter's flattened local values, at ``shard_start`` in the shard."""

    index: int
    param_start: int
    shard_start: int
    length: int


def shard_pieces(sizes: list[int], ranks: int, rank: int) -> tuple[int, list[Piece]]:
    """(shard length, the pieces of the parameters in ``rank``'s shard) for parameters of
    ``sizes`` values laid end to end and padded to a multiple of ``ranks``."""
    total = sum(sizes)
    length = -(-total // ranks)
    lo, hi = rank * length, (rank + 1) * length
    pieces, start = [], 0
    for i, n in enumerate(sizes):
        a, b = max(start, lo), min(start + n, hi)
        if a < b:
            pieces.append(Piece(i, a - start, a - lo, b - a))
        start += n
    return length, pieces


class Zero1Optimizer:
    """Optimizer state partitioned over the data-parallel group (see module docstring)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
        group: dist.ProcessGroup,
    ):
        values = [local(p).detach() for p in params]
        dtypes = {v.dtype for v in values}
        if len(dtypes) != 1:
            raise ValueError(f"ZeRO-1 needs parameters of one dtype, got {sorted(map(str, dtypes))}")
        self.params, self.group = params, group
        self.size = dist.get_world_size(group)
        self.sizes = [v.numel() for v in values]
        self.total = sum(self.sizes)
        self.shard_len, self.pieces = shard_pieces(self.sizes, self.size, dist.get_rank(group))
        self.in_place = dist.get_backend(group) == "gloo"  # the collectives: module docstring
        self.flat = torch.zeros(self.shard_len * self.size, dtype=values[0].dtype, device=values[0].device)
        self.flat[: self.total] = torch.cat([v.reshape(-1) for v in values])
        # each parameter's place in the flat buffer, shaped as its local values
        self.views = [s.view_as(v) for s, v in zip(torch.split(self.flat[: self.total], self.sizes), values)]
        lo = dist.get_rank(group) * self.shard_len
        self.own = self.flat[lo : lo + self.shard_len]  # this rank's shard of the buffer
        self.master = nn.Parameter(self.own.clone())
        self.optimizer = make_optimizer([self.master])

    @torch.no_grad()
    def reduce_grads(self) -> None:
        """Average the gradients over the group into this rank's shard; drop the full gradients."""
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(local(p.grad))
        self.flat[self.total :].zero_()
        if self.in_place:
            dist.all_reduce(self.flat, group=self.group)
            shard = self.own
        else:
            shard = torch.empty(self.shard_len, dtype=self.flat.dtype, device=self.flat.device)
            _reduce_scatter(shard, self.flat, group=self.group)
        self.master.grad = shard.div_(self.size)
        for p in self.params:
            p.grad = None

    def weighted_grads(self, weights: list[float]) -> list[tuple[torch.Tensor, float]]:
        """The shard's gradient, cut per parameter, each piece with its parameter's weight in the
        global norm (``weights[i]`` for ``params[i]``)."""
        g = self.master.grad
        if g is None:
            return []
        return [(g[pc.shard_start : pc.shard_start + pc.length], weights[pc.index]) for pc in self.pieces]

    @torch.no_grad()
    def step(self) -> None:
        """Update the shard, all-gather every rank's shard and copy the values into the parameters."""
        self.optimizer.step()
        if self.in_place:
            self.master.grad = None  # a view of the buffer the gather overwrites
            self.flat.zero_()
            self.own.copy_(self.master.detach())
            dist.all_reduce(self.flat, group=self.group)
        else:
            _all_gather(self.flat, self.master.detach(), group=self.group)
        torch._foreach_copy_([local(p).detach() for p in self.params], self.views)

    def zero_grad(self) -> None:
        self.master.grad = None
        for p in self.params:
            p.grad = None
