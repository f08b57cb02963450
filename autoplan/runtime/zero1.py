"""ZeRO-1 for layouts where ``ZeroRedundancyOptimizer`` cannot be used (with TP or PP).

Each data-parallel rank owns whole parameters (their local TP shards), assigned greedily
by size so the optimizer state is balanced. After backward, each owner receives the sum of
its parameters' gradients (one ``reduce`` per owner bucket) and averages it; only owners
keep gradients and optimizer state. After the owner's optimizer step, the updated values
are broadcast back to the other data-parallel ranks.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from autoplan.runtime.data_parallel import buckets, local


def assign_owners(sizes: list[int], ranks: int) -> list[int]:
    """Owner rank of each parameter: largest first, each to the least-loaded rank."""
    load = [0] * ranks
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(ranks), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += sizes[i]
    return owner


class Zero1Optimizer:
    """Optimizer state partitioned over the data-parallel group (see module docstring)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
        group: dist.ProcessGroup,
    ):
        self.params = params
        self.group = group
        self.size = dist.get_world_size(group)
        self.me = dist.get_rank(group)
        self.global_ranks = dist.get_process_group_ranks(group)
        owner = assign_owners([local(p).numel() for p in params], self.size)
        self.by_owner: dict[int, list[nn.Parameter]] = {r: [] for r in range(self.size)}
        for p, r in zip(params, owner):
            self.by_owner[r].append(p)
        self.owned = self.by_owner[self.me]
        self.optimizer: Optional[torch.optim.Optimizer] = make_optimizer(self.owned) if self.owned else None

    @torch.no_grad()
    def reduce_grads(self) -> None:
        """Sum each owner's gradients onto it and average; drop gradients this rank does not own."""
        for r, ps in self.by_owner.items():
            grads = [local(p.grad) for p in ps if p.grad is not None]
            for bucket in buckets(grads):
                flat = _flatten_dense_tensors(bucket)
                dist.reduce(flat, dst=self.global_ranks[r], group=self.group)
                if r == self.me:
                    flat.div_(self.size)
                    for g, s in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                        g.copy_(s)
            if r != self.me:
                for p in ps:
                    p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Owners update their parameters, then every owner broadcasts its updated values."""
        if self.optimizer is not None:
            self.optimizer.step()
        for r, ps in self.by_owner.items():
            values = [local(p) for p in ps]
            for bucket in buckets(values):
                flat = _flatten_dense_tensors(bucket)
                dist.broadcast(flat, src=self.global_ranks[r], group=self.group)
                if r != self.me:
                    for v, s in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                        v.copy_(s)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
