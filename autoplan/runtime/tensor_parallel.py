"""Megatron-style tensor (and sequence) parallelism with DTensor ``parallelize_module``.

Column split: q, k, v, fc1 (and the SwiGLU gate); row split: o, fc2. Without sequence
parallelism the residual stream is replicated and each row-parallel output is all-reduced.
With it the residual stream, layernorms and dropout regions are sharded along the sequence
(dim 1): the embedding output is scattered, each layer all-gathers before attention / MLP
and reduce-scatters after, and the head gathers the sequence back.

The vocabulary is split as Megatron-LM splits it (``VocabParallelEmbedding`` and the
column-parallel output layer, Narayanan et al. 2021 section 3.2; torchtitan shards its
``tok_embeddings`` and ``output`` the same way; autoplan.runtime.vocab_parallel): the token
embedding by rows (each rank looks up its V/t rows, one all-reduce of the b*s*h output in the
forward), the output projection by columns (each rank computes its V/t logits, one all-reduce of
the input gradient in the backward), and the loss reads the split logits. A tied embedding is
one weight split the same way (rows of the table, rows of the projection). The final norm and
the learned positions stay replicated.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autoplan.runtime.model import GPT, Block
from autoplan.runtime.vocab_parallel import VocabParallelEmbedding, VocabParallelOutput


def _layer_plan(block: Block, sp: bool) -> dict[str, ParallelStyle]:
    residual = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(output_layouts=residual),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=residual),
    }
    if block.mlp.gate is not None:
        plan["mlp.gate"] = ColwiseParallel()
    # The attention and MLP inputs become one DTensor each, so the partial input-gradients of
    # q, k and v (of fc1 and gate) add up before a single all-reduce (SP: reduce-scatter), as
    # Megatron's fused QKV does, instead of one collective per projection.
    gather = PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),))
    plan.update({"attn": gather, "mlp": gather})
    if sp:
        plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel()})
    return plan


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Shard ``model``'s layers, token embedding and output projection over ``tp_mesh`` in place
    (works on a meta-device model; tie the weights again after, GPT.tie_weights)."""
    for block in model.layers.values():
        assert isinstance(block, Block)
        parallelize_module(block, tp_mesh, _layer_plan(block, sp))
    if model.embed is not None:
        model.embed.tok = VocabParallelEmbedding(model.embed.tok, tp_mesh)
    if model.head is not None:
        model.head.out = VocabParallelOutput(model.head.out, tp_mesh)
    if not sp:
        return
    if model.embed is not None:
        parallelize_module(
            model.embed,
            tp_mesh,
            PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True),
        )
    if model.head is not None:
        parallelize_module(
            model.head,
            tp_mesh,
            PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True),
        )
