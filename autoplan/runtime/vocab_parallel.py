"""The vocabulary split over the tensor-parallel ranks: the token embedding's lookup and the
cross entropy of the logits.

**Lookup** (Megatron-LM's ``VocabParallelEmbedding``, megatron/core/tensor_parallel/layers.py):
each rank holds rows ``[start, start + V/t)`` of the table, looks up the tokens among them (zeros
for the others) and one all-reduce sums the ranks' outputs; its backward passes the gradient
through, so each rank's table gets a gradient of its own rows only (DTensor's embedding on a
row-split table hands back a replicated V x h gradient instead: a whole table per rank).

**Logits** (Megatron's ``ColumnParallelLinear``): each rank multiplies the replicated input by
its V/t rows of the output weight; the input's gradient is all-reduced in the backward.

Both run on the local rows of a DTensor parameter (plain tensor ops: no DTensor dispatch, whose
host time per op is a large share of a small model's step on CPU), so a tied embedding is one
parameter split the same way, and FSDP2, the gradient norm and the tied-embedding sum see a
tensor-parallel DTensor as they do the layers' weights.

**Loss.** With ``t > 1`` each tensor-parallel rank holds ``V / t`` columns of the logits (the
head is column-parallel), as Megatron-LM's vocab-parallel cross entropy reads them
(megatron/core/tensor_parallel/cross_entropy.py, ``VocabParallelCrossEntropy``, which all-reduces
the max, the target's logit and the sum of exponentials: three collectives). Here each rank
sends its own three per token in one all-gather, and every rank combines them:

    m_r = max of rank r's logits,  z_r = sum over its columns of exp(logit - m_r)
    M   = max_r m_r,   Z = sum_r z_r exp(m_r - M),   l_y = the target's logit (from its rank)
    loss = log Z + M - l_y, averaged over the tokens

in fp32: one collective of ``3 * b * s`` floats per rank per microbatch. The backward needs none:
d loss / d logit = softmax - onehot on the rank's own columns (softmax = exp(logit - m_r) *
exp(m_r - M) / Z), scaled by the incoming gradient over the token count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard

from autoplan.runtime.tp_collectives import copy_to_group, reduce_from_group
from autoplan.runtime.tp_params import local, placed


def first_row(mesh: DeviceMesh, vocab: int) -> int:
    """The first vocabulary entry of this rank's share, as a DTensor ``Shard`` splits ``vocab``
    (``torch.chunk``: rank r holds the ceil(V/t) entries from r*ceil(V/t), the last ones fewer)."""
    return mesh.get_local_rank() * -(-vocab // mesh.size())


class VocabParallelEmbedding(nn.Embedding):
    """A token embedding whose table is a DTensor split by rows over ``mesh`` (module and
    parameter names as nn.Embedding's: ``tok.weight``)."""

    def __init__(self, table: nn.Embedding, mesh: DeviceMesh):
        super().__init__(table.num_embeddings, table.embedding_dim, device="meta")
        self.weight = placed(table.weight, mesh, Shard(0))
        self.mesh = mesh

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = local(self.weight)
        ids = tokens - first_row(self.mesh, self.num_embeddings)
        outside = (ids < 0) | (ids >= rows.shape[0])
        out = F.embedding(ids.masked_fill(outside, 0), rows).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_group(out, self.mesh.get_group())


class VocabParallelOutput(nn.Linear):
    """The output projection with its V x h weight a DTensor split by rows over ``mesh``: each
    rank computes its own V/t logits (Megatron's ``ColumnParallelLinear`` without the gather;
    names as nn.Linear's: ``out.weight``)."""

    def __init__(self, linear: nn.Linear, mesh: DeviceMesh):
        super().__init__(linear.in_features, linear.out_features, bias=False, device="meta")
        self.weight = placed(linear.weight, mesh, Shard(0))
        self.mesh = mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_group(x, self.mesh.get_group()), local(self.weight))


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, group: dist.ProcessGroup, start: int
    ) -> torch.Tensor:
        rows = logits.float().reshape(-1, logits.shape[-1])
        width = rows.shape[-1]
        local = targets.reshape(-1) - start
        mine = (local >= 0) & (local < width)
        local = local.clamp(0, width - 1)
        mx = rows.max(dim=-1).values
        picked = rows.gather(1, local.unsqueeze(1)).squeeze(1) * mine  # the target's logit, where it is ours
        exp = (rows - mx.unsqueeze(-1)).exp_()
        mine_stats = torch.stack((mx, exp.sum(dim=-1), picked))
        stats = [torch.empty_like(mine_stats) for _ in range(dist.get_world_size(group))]
        dist.all_gather(stats, mine_stats, group=group)
        every = torch.stack(stats)  # [t, 3, tokens]: each rank's max, sum of exp over its max, target logit
        top = every[:, 0].max(dim=0).values
        z = (every[:, 1] * (every[:, 0] - top).exp()).sum(dim=0)
        exp.mul_(((mx - top).exp() / z).unsqueeze(-1))  # the softmax of the rank's columns, kept for the backward
        ctx.save_for_backward(exp, local, mine)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return (z.log() + top - every[:, 2].sum(dim=0)).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local, mine = ctx.saved_tensors
        softmax.scatter_add_(1, local.unsqueeze(1), -mine.to(softmax.dtype).unsqueeze(1))
        softmax.mul_(grad / softmax.shape[0])
        return softmax.to(ctx.dtype).reshape(ctx.shape), None, None, None


def vocab_parallel_loss(mesh: DeviceMesh, vocab: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The mean next-token cross entropy of logits whose ``vocab`` columns are split over
    ``mesh`` as a DTensor ``Shard`` splits them (:func:`first_row`), equal to
    ``autoplan.runtime.model.lm_loss`` of the whole logits."""
    group, start = mesh.get_group(), first_row(mesh, vocab)

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _VocabParallelCrossEntropy.apply(logits, targets, group, start)

    return loss
