"""Gradient bookkeeping across the whole grid: tied embeddings and global-norm clipping.

``clip_grad_norm_`` cannot be used with TP or PP (it neither knows which shards are
replicas nor sums across pipeline stages), so the norm is computed here: every rank sums
the squares of the gradients it holds, each divided by the number of ranks holding an
identical copy, and one all-reduce over the world gives the global sum of squares.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autoplan.runtime.data_parallel import local


def replicas(p: nn.Parameter, t: int, d: int, dp_unique: bool) -> int:
    """How many ranks of one pipeline stage hold this parameter's local values.

    A DTensor sharded over the ``tp`` (``dp``) mesh dimension is unique along it (with hybrid
    sharding, sharded over ``dp_shard`` it is held once per ``dp_replicate`` group); anything
    else is replicated t times over tensor parallelism and d times over data parallelism,
    unless ``dp_unique`` (ZeRO-1 ownership: only the owner keeps the gradient).
    """
    tp_rep, dp_rep = t, 1 if dp_unique else d
    if isinstance(p, DTensor):
        mesh = p.device_mesh
        for i, (name, placement) in enumerate(zip(mesh.mesh_dim_names or (), p.placements)):
            if not (placement.is_replicate() or placement.is_partial()):  # Shard or FSDP's _StridedShard
                if name == "tp":
                    tp_rep = 1
                elif name in ("dp", "dp_shard"):
                    dp_rep = max(1, dp_rep // mesh.size(i))
    return tp_rep * dp_rep


@torch.no_grad()
def settle_partial_grads(params: list[nn.Parameter]) -> None:
    """Give every DTensor gradient its parameter's placements (resolving pending partial sums)."""
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(p.device_mesh, p.placements)


@torch.no_grad()
def clip_global_norm(weighted: list[tuple[torch.Tensor, float]], max_norm: float | None, device: torch.device) -> float:
    """Global L2 norm of all local gradients (each weighted by 1/replicas); scale them to ``max_norm``.

    Same arithmetic as ``torch.nn.utils.clip_grad_norm_``: the norm of the tensors' norms
    (``torch.nn.utils.get_total_norm``, one foreach kernel per device and dtype), here per
    replica weight, their weighted squares summed in fp64; coef = max_norm / (norm + 1e-6),
    clamped to 1. A weight of 0 (a duplicate copy) leaves the tensor out of the norm only.
    """
    groups: dict[tuple[torch.device, float], list[torch.Tensor]] = {}  # offloaded gradients live on the CPU
    for g, w in weighted:
        if w > 0:
            groups.setdefault((g.device, w), []).append(g)
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for (_, w), grads in groups.items():
        sq += (torch.nn.utils.get_total_norm(grads).double() ** 2 * w).to(device)
    dist.all_reduce(sq)
    norm = math.sqrt(float(sq))
    coef = min(1.0, max_norm / (norm + 1e-6)) if max_norm is not None else 1.0
    if coef < 1.0:  # a factor of 1 (clamped) leaves the gradients as they are
        for g, _ in weighted:
            g.mul_(coef)
    return norm


class TiedEmbeddingSync:
    """Sums the gradients of the tied embedding held by the first and the last pipeline stage.

    Every rank must construct this (it creates one two-rank group per (dp, tp) position).
    """

    def __init__(self, p: int, d: int, t: int, rank: int, param: torch.Tensor | None):
        self.param = param
        self.group: dist.ProcessGroup | None = None
        for dp in range(d):
            for tp in range(t):
                first, last = dp * t + tp, ((p - 1) * d + dp) * t + tp
                g = dist.new_group([first, last])
                if rank in (first, last):
                    self.group = g

    @torch.no_grad()
    def __call__(self) -> None:
        if self.param is not None and self.param.grad is not None:
            dist.all_reduce(local(self.param.grad), group=self.group)


class LocalTiedSum:
    """Sums the gradients of the tied embedding's two copies on one rank (ZB-V's rank 0 runs the
    first and the last stage): both copies get the sum, so their updates stay equal. (One shared
    parameter would not do: torch's schedule scales each stage's gradients by 1/m, twice.)"""

    def __init__(self, embedding: torch.Tensor, head: torch.Tensor):
        self.embedding, self.head = embedding, head

    @torch.no_grad()
    def __call__(self) -> None:
        a, b = self.embedding.grad, self.head.grad
        if a is None or b is None:
            return
        total = local(a) + local(b)
        local(a).copy_(total)
        local(b).copy_(total)
