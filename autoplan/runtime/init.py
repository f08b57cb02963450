"""Layout-independent parameter initialization.

Every parameter is drawn from its own CPU generator seeded by (run seed, parameter name),
as the full unsharded tensor, and each rank keeps its shard. So the single-process
reference, every pipeline chunk and every tensor-parallel shard start from exactly the same
weights, on any device.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor


def canonical_name(name: str, tied: bool) -> str:
    """Tied output weights are initialized as (and equal to) the token embedding."""
    return "embed.tok.weight" if tied and name == "head.out.weight" else name


def full_init(name: str, shape: torch.Size, seed: int, std: float) -> torch.Tensor:
    """The unsharded initial value of parameter ``name`` (fp32, CPU)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    if ".ln" in name or ".norm" in name:
        return torch.ones(shape)
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.empty(shape).normal_(0.0, std, generator=g)


@torch.no_grad()
def init_parameters(module: nn.Module, seed: int, std: float, tied: bool) -> None:
    """Fill every parameter (plain or DTensor) of ``module`` with its layout-independent value."""
    for name, p in module.named_parameters():
        full = full_init(canonical_name(name, tied), p.shape, seed, std)
        if isinstance(p, DTensor):
            local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
            p.to_local().copy_(local)
        else:
            p.copy_(full)
