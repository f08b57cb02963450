"""Megatron-style tensor (and sequence) parallelism on plain tensors.

Column split: q, k, v, fc1 (and the SwiGLU gate); row split: o, fc2 (Megatron-LM's
``ColumnParallelLinear`` and ``RowParallelLinear``, Shoeybi et al. 2019 section 3). Without
sequence parallelism the residual stream is replicated: the attention and MLP inputs are copied to
the group (their gradient all-reduced once for q, k and v, once for fc1 and gate, as Megatron's
fused QKV does), and each row-parallel output is all-reduced. With it (Korthikanti et al. 2022
section 4.2.2) the residual stream and the layer norms are split along the sequence: each layer
all-gathers the sequence before attention and before the MLP (the gradient reduce-scattered) and
reduce-scatters after (the gradient all-gathered), the embedding output is scattered and the head
gathers the sequence back. The collectives are autoplan.runtime.tp_collectives.

The vocabulary is split as Megatron-LM splits it (``VocabParallelEmbedding`` and the
column-parallel output layer, Narayanan et al. 2021 section 3.2; torchtitan shards its
``tok_embeddings`` and ``output`` the same way; autoplan.runtime.vocab_parallel). A tied embedding
is one weight split the same way. The final norm and the learned positions stay replicated.

Every split parameter is a DTensor on the tensor-parallel mesh, placed as torch's
``ColwiseParallel`` / ``RowwiseParallel`` / ``SequenceParallel`` place it (weights ``Shard(0)`` /
``Shard(1)``, a row-split layer's bias and a sequence-parallel norm's weights ``Replicate()``),
so initialization, FSDP2, ZeRO-1 and the gradient norm see the same parameters as under torch's
``parallelize_module``. The forward runs on their local tensors: no DTensor dispatch per op,
whose host time was ten times the plain layer's on CPU (``tp_layer_forward_us`` in
hwprofiles/gpus/cpu.yaml before 2026-11-27). A replicated weight applied to a sequence chunk gets
a partial gradient (``Partial()``), summed over the group before the optimizer step
(autoplan.runtime.grads.settle_partial_grads). The parameters' placing and local reads are
autoplan.runtime.tp_params.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard

from autoplan.runtime.model import GPT, Block
from autoplan.runtime.tp_collectives import (
    copy_to_group,
    gather_from_sequence,
    reduce_from_group,
    reduce_scatter_to_sequence,
    scatter_to_sequence,
)
from autoplan.runtime.tp_params import local, placed
from autoplan.runtime.vocab_parallel import VocabParallelEmbedding, VocabParallelOutput


def _placed_bias(module: nn.Module, mesh: DeviceMesh, placement: Placement) -> nn.Parameter | None:
    bias = getattr(module, "bias", None)
    return None if bias is None else placed(bias, mesh, placement)


def _local_bias(p: torch.Tensor | None, partial_grad: bool = False) -> torch.Tensor | None:
    return None if p is None else local(p, partial_grad)


class ColumnParallelLinear(nn.Linear):
    """``linear`` with its output features split over ``mesh`` (weight and bias ``Shard(0)``);
    its input is the whole activation, copied to the group beforehand (:func:`_enter`)."""

    def __init__(self, linear: nn.Linear, mesh: DeviceMesh):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight = placed(linear.weight, mesh, Shard(0))
        self.bias = _placed_bias(linear, mesh, Shard(0))  # type: ignore[assignment]  # nn.Linear's optional bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, local(self.weight), _local_bias(self.bias))


class RowParallelLinear(nn.Linear):
    """``linear`` with its input features split over ``mesh`` (weight ``Shard(1)``): the ranks'
    partial outputs are all-reduced, or under sequence parallelism reduce-scattered along the
    sequence, then the replicated bias is added."""

    def __init__(self, linear: nn.Linear, mesh: DeviceMesh, sp: bool):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight = placed(linear.weight, mesh, Shard(1))
        self.bias = _placed_bias(linear, mesh, Replicate())  # type: ignore[assignment]  # nn.Linear's optional bias
        self.group, self.sp = mesh.get_group(), sp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, local(self.weight))
        y = reduce_scatter_to_sequence(partial, self.group) if self.sp else reduce_from_group(partial, self.group)
        bias = _local_bias(self.bias, partial_grad=self.sp)
        return y if bias is None else y + bias


class SequenceParallelNorm(nn.Module):
    """A LayerNorm or RMSNorm over this rank's chunk of the sequence, its weights replicated
    DTensors whose gradients are partial sums (names as the norm's: ``weight``, ``bias``)."""

    def __init__(self, norm: nn.Module, mesh: DeviceMesh):
        super().__init__()
        assert isinstance(norm, (nn.LayerNorm, nn.RMSNorm))
        self.rms = isinstance(norm, nn.RMSNorm)
        self.shape, self.eps = tuple(norm.normalized_shape), norm.eps
        self.weight = placed(norm.weight, mesh, Replicate())
        self.bias = _placed_bias(norm, mesh, Replicate())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = local(self.weight, partial_grad=True), _local_bias(self.bias, partial_grad=True)
        if self.rms:
            return F.rms_norm(x, self.shape, weight, self.eps)
        assert self.eps is not None  # a LayerNorm's is a number
        return F.layer_norm(x, self.shape, weight, bias, self.eps)


def _enter(mesh: DeviceMesh, sp: bool) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]:
    """A forward pre-hook for attention and MLP: their input as the column-parallel GEMMs need it
    (the whole sequence, its gradient summed over the group)."""
    group = mesh.get_group()

    def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x = args[0]
        return (gather_from_sequence(x, group, grad_is_partial=True) if sp else copy_to_group(x, group), *args[1:])

    return hook


def parallelize_block(block: nn.Module, mesh: DeviceMesh, sp: bool) -> None:
    """Split ``block``'s GEMMs (and under sequence parallelism its norms) over ``mesh``, in place:
    a pre-norm layer named as :class:`autoplan.runtime.model.Block` (ln1, attn.q/k/v/o, ln2,
    mlp.fc1/gate/fc2)."""
    attn, mlp = block.attn, block.mlp
    assert isinstance(attn, nn.Module) and isinstance(mlp, nn.Module)
    for owner, name in ((attn, "q"), (attn, "k"), (attn, "v"), (mlp, "fc1"), (mlp, "gate")):
        linear = getattr(owner, name, None)
        if linear is not None:
            setattr(owner, name, ColumnParallelLinear(linear, mesh))
    assert isinstance(attn.o, nn.Linear) and isinstance(mlp.fc2, nn.Linear)
    attn.o = RowParallelLinear(attn.o, mesh, sp)
    mlp.fc2 = RowParallelLinear(mlp.fc2, mesh, sp)
    attn.register_forward_pre_hook(_enter(mesh, sp))
    mlp.register_forward_pre_hook(_enter(mesh, sp))
    if sp:
        for name in ("ln1", "ln2"):
            setattr(block, name, SequenceParallelNorm(getattr(block, name), mesh))


def split_layer(layer: nn.Module, mesh: DeviceMesh) -> None:
    """The program's split of one layer without sequence parallelism: what ``autoplan calibrate``
    times as the tensor-parallel layer (hwprofiles.calibrate.eager.tp_layer_ratios)."""
    parallelize_block(layer, mesh, sp=False)


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Shard ``model``'s layers, token embedding and output projection over ``tp_mesh`` in place
    (works on a meta-device model; tie the weights again after, GPT.tie_weights)."""
    for block in model.layers.values():
        assert isinstance(block, Block)
        parallelize_block(block, tp_mesh, sp)
    group = tp_mesh.get_group()
    if model.embed is not None:
        model.embed.tok = VocabParallelEmbedding(model.embed.tok, tp_mesh)
        if sp:  # the embedding's output (replicated after its all-reduce) split along the sequence
            model.embed.register_forward_hook(lambda _m, _args, out: scatter_to_sequence(out, group))
    if model.head is not None:
        model.head.out = VocabParallelOutput(model.head.out, tp_mesh)
        if sp:  # the whole sequence back; every rank's gradient of it is whole (the output layer sums it)
            model.head.register_forward_pre_hook(
                lambda _m, args: (gather_from_sequence(args[0], group, grad_is_partial=False),)
            )
