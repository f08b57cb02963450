"""Context parallelism in autoplan's program: each rank runs one chunk of every sequence.

The plan's cp ranks of one data-parallel replica hold consecutive chunks of its sequences
(rank c of the group: tokens [c*s/cp, (c+1)*s/cp)). Everything but attention is per token, so
it runs on the chunk unchanged; attention all-gathers the keys and values of the whole sequence
over the cp group (an all-gather whose backward returns each rank the summed gradients of its
own keys and values) and masks causally by global position: query i of chunk c
attends to keys j <= c*s/cp + i. Positions (rotary or learned) are offset by the chunk's start.

This is the all-gather form of context parallelism (Llama 3's, Dubey et al. 2024, section
3.3.2), which runs on gloo; Transformer Engine's ring (what simulator.cost.context prices and the
Megatron-LM export runs) moves the same K/V bytes in cp-1 steps beside the attention instead.
Gradients are averaged over the d*cp ranks that hold the same weights (the rank's view of
simulator.cost.rank_view: the program's data-parallel group is that group, and each chunk's mean
loss weighs the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from simulator.cost.layout import rank_of
from simulator.plan import Plan


@dataclass(frozen=True)
class ContextShard:
    """This rank's chunk of every sequence: chunk ``index`` of ``size``, K/V gathered over ``group``."""

    size: int
    index: int
    group: dist.ProcessGroup | None = None

    def chunk(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's chunk of ``x`` along its sequence dimension ``dim`` (tokens: (batch, seq))."""
        n = x.shape[dim] // self.size
        return x.narrow(dim, self.index * n, n).contiguous()

    def offset(self, local_seq: int) -> int:
        """Global position of this rank's first token."""
        return self.index * local_seq

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The whole sequence of (batch, heads, local seq, dim) ``x`` from every rank of the group,
        in chunk order (differentiable: :class:`_GatherSequence`)."""
        out: torch.Tensor = _GatherSequence.apply(x, self)
        return out

    def causal_mask(self, local_seq: int, device: torch.device) -> torch.Tensor:
        """(local seq, seq) boolean mask: True where a query may attend to a key."""
        queries = torch.arange(local_seq, device=device) + self.offset(local_seq)
        keys = torch.arange(local_seq * self.size, device=device)
        return keys[None, :] <= queries[:, None]


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dim 2) over the cp group. Backward: every rank's gradient of
    the whole sequence summed over the group, and this rank's chunk of it (an all-reduce: gloo has
    no reduce-scatter, and torch.distributed.nn's gloo fallback scatters from global rank
    numbers, which fails on a group without rank 0)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, shard: ContextShard) -> torch.Tensor:
        ctx.shard = shard
        parts = [torch.empty_like(x) for _ in range(shard.size)]
        dist.all_gather(parts, x.contiguous(), group=shard.group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        shard: ContextShard = ctx.shard
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=shard.group)
        return shard.chunk(total, dim=2), None


def context_shard(plan: Plan, rank: int) -> ContextShard | None:
    """This rank's shard, making the process groups of every cp group (a collective: every rank
    calls it, in the same order). The program's rank grid is the plan's rank view (t, p,
    d*cp: simulator.cost.rank_view.rank_plan), in which the cp ranks of a replica are consecutive
    data-parallel coordinates: dp' = dp*cp + c."""
    if plan.cp == 1:
        return None
    t, g = plan.t, plan.grad_group
    mine: ContextShard | None = None
    for pp in range(plan.p):
        for dp in range(plan.d):
            for tp in range(t):
                ranks = [rank_of(pp, dp * plan.cp + c, tp, t, g) for c in range(plan.cp)]
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine = ContextShard(plan.cp, ranks.index(rank), group)
    return mine
