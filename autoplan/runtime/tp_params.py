"""The DTensor parameters of the tensor-parallel layers (autoplan.runtime.tensor_parallel,
autoplan.runtime.vocab_parallel): placed on the tensor-parallel mesh, so initialization, FSDP2,
ZeRO-1 and the gradient norm see them as torch's ``parallelize_module`` would place them, and
read as local tensors in the forward (plain ops, no DTensor dispatch per op)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, distribute_tensor


def placed(t: torch.Tensor, mesh: DeviceMesh, placement: Placement) -> nn.Parameter:
    """``t`` as a parameter distributed over the 1-D ``mesh`` by ``placement``."""
    return nn.Parameter(distribute_tensor(t, mesh, [placement]))


def local(p: torch.Tensor, partial_grad: bool = False) -> torch.Tensor:
    """This rank's tensor of a DTensor parameter (differentiable: its gradient comes back placed
    as the parameter); ``partial_grad``: the gradient is this rank's share of a sum over the
    group (a replicated weight applied to a sequence chunk)."""
    assert isinstance(p, DTensor)
    return p.to_local(grad_placements=[Partial()]) if partial_grad else p.to_local()
