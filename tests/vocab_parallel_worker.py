"""One rank of tests/test_vocab_parallel.py (torchrun, gloo, 2 ranks): the vocabulary split over
the ranks against the whole-vocabulary modules, on 11 entries (6 + 5 rows, an uneven split), and
the tensor- and sequence-parallel collectives (autoplan.runtime.tp_collectives) against sums and
slices."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from autoplan.runtime.tp_collectives import (
    copy_to_group,
    gather_from_sequence,
    reduce_from_group,
    reduce_scatter_to_sequence,
    scatter_to_sequence,
)
from autoplan.runtime.vocab_parallel import VocabParallelEmbedding, VocabParallelOutput, vocab_parallel_loss

VOCAB, WIDTH, TOKENS = 11, 4, 24


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    rank = dist.get_rank()
    rows = slice(0, 6) if rank == 0 else slice(6, 11)
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(VOCAB, WIDTH, generator=gen)
    tokens = torch.randint(0, VOCAB, (2, TOKENS // 2), generator=gen)
    logits = torch.randn(2, TOKENS // 2, VOCAB, generator=gen)

    whole = nn.Embedding(VOCAB, WIDTH)
    whole.weight.data.copy_(table)
    want = whole(tokens)
    want.square().sum().backward()
    split = VocabParallelEmbedding(nn.Embedding(VOCAB, WIDTH, device="meta"), mesh)
    split.to_empty(device="cpu")
    assert isinstance(split.weight, DTensor)
    split.weight.to_local().data.copy_(table[rows])
    got = split(tokens)
    got.square().sum().backward()
    grad = split.weight.grad
    assert isinstance(grad, DTensor) and tuple(grad.placements) == (Shard(0),), grad
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad.to_local(), whole.weight.grad[rows])

    hidden = torch.randn(2, TOKENS // 2, WIDTH, generator=gen)
    x_whole = hidden.clone().requires_grad_(True)
    whole_out = nn.Linear(WIDTH, VOCAB, bias=False)
    whole_out.weight.data.copy_(table)
    whole_logits = whole_out(x_whole)
    (whole_logits * logits).sum().backward()
    out = VocabParallelOutput(nn.Linear(WIDTH, VOCAB, bias=False, device="meta"), mesh)
    out.to_empty(device="cpu")
    assert isinstance(out.weight, DTensor)
    out.weight.to_local().data.copy_(table[rows])
    x_split = hidden.clone().requires_grad_(True)
    split_logits = out(x_split)
    (split_logits * logits[..., rows]).sum().backward()
    torch.testing.assert_close(split_logits, whole_logits[..., rows])
    torch.testing.assert_close(x_split.grad, x_whole.grad)  # the input's gradient summed over the ranks
    assert isinstance(out.weight.grad, DTensor) and tuple(out.weight.grad.placements) == (Shard(0),)
    torch.testing.assert_close(out.weight.grad.to_local(), whole_out.weight.grad[rows])

    full = logits.clone().requires_grad_(True)
    want_loss = F.cross_entropy(full.reshape(-1, VOCAB), tokens.reshape(-1))
    want_loss.backward()
    mine = logits[..., rows].clone().requires_grad_(True)
    got_loss = vocab_parallel_loss(mesh, VOCAB)(mine, tokens)
    got_loss.backward()
    torch.testing.assert_close(got_loss, want_loss)
    torch.testing.assert_close(mine.grad, full.grad[..., rows])
    check_collectives(mesh.get_group(), rank)
    dist.barrier()  # no rank leaves while another still waits on its last collective
    dist.destroy_process_group()


def check_collectives(group: dist.ProcessGroup, rank: int) -> None:
    """autoplan.runtime.tp_collectives against sums and slices computed here: every rank draws both
    ranks' tensors from one seed, so it knows what the others hold. A (2, 6, 3) activation, its
    sequence (dim 1) split into 3 + 3 positions."""
    gen = torch.Generator().manual_seed(1)
    xs, gs = torch.randn(2, 2, 6, 3, generator=gen), torch.randn(2, 2, 6, 3, generator=gen)  # [rank, ...]
    seq = slice(3 * rank, 3 * rank + 3)
    own_chunks = torch.cat([gs[r][:, 3 * r : 3 * r + 3] for r in (0, 1)], 1)  # each rank's chunk of its gradient

    def run(
        fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor
    ) -> tuple[torch.Tensor, Any]:
        leaf = x.clone().requires_grad_(True)
        out = fn(leaf)
        out.backward(grad.clone())  # a collective may sum into the incoming gradient in place, as Megatron's do
        return out.detach(), leaf.grad

    out, grad = run(lambda x: copy_to_group(x, group), xs[rank], gs[rank])
    torch.testing.assert_close((out, grad), (xs[rank], gs.sum(0)))
    out, grad = run(lambda x: reduce_from_group(x * 1.0, group), xs[rank], gs[0])
    torch.testing.assert_close((out, grad), (xs.sum(0), gs[0]))
    out, grad = run(lambda x: scatter_to_sequence(x, group), xs[0], gs[rank][:, seq])
    torch.testing.assert_close((out, grad), (xs[0][:, seq], own_chunks))
    out, grad = run(lambda x: gather_from_sequence(x, group, grad_is_partial=True), xs[0][:, seq], gs[rank])
    torch.testing.assert_close((out, grad), (xs[0], gs.sum(0)[:, seq]))
    out, grad = run(lambda x: gather_from_sequence(x, group, grad_is_partial=False), xs[0][:, seq], gs[0])
    torch.testing.assert_close((out, grad), (xs[0], gs[0][:, seq]))
    out, grad = run(lambda x: reduce_scatter_to_sequence(x * 1.0, group), xs[rank], gs[rank][:, seq])
    torch.testing.assert_close((out, grad), (xs.sum(0)[:, seq], own_chunks))


if __name__ == "__main__":
    main()
    # Leave without the interpreter's finalization: a gloo run-loop thread still finishing a
    # DTensor collective's completion takes the GIL while Py_FinalizeEx runs, and CPython ends such
    # a thread with pthread_exit, whose unwinding through ProcessGroupGloo::runLoop (noexcept) calls
    # std::terminate: "terminate called without an active exception", SIGABRT, about 1 run in 8 on
    # 2 cores with torch 2.13 (gdb: the thread's stack is runLoop -> __pthread_unwind while the main
    # thread is in Py_FinalizeEx). Every check above has passed when this line runs.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
