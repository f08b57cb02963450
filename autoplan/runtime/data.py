"""Synthetic training data from a seeded generator, identical for every layout.

Step k's global batch is drawn from a generator seeded by (seed, k): B sequences of
seq+1 tokens. Each sequence follows a random affine recurrence modulo the vocabulary with
some noise, so there is something to learn and the loss moves. Data-parallel rank r takes
sequences [r*B/d, (r+1)*B/d); the single-process reference takes all of them.
"""

from __future__ import annotations

import torch


def global_batch(step: int, batch: int, seq: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of step ``step``: int64 tensors shaped (batch, seq), on CPU."""
    g = torch.Generator().manual_seed(seed * 7919 + step)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, max(2, vocab // 8), (batch, 1), generator=g)
    pos = torch.arange(seq + 1).unsqueeze(0)
    tokens = (start + stride * pos) % vocab
    noise = torch.rand(batch, seq + 1, generator=g) < 0.1
    tokens = torch.where(noise, torch.randint(0, vocab, (batch, seq + 1), generator=g), tokens)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def local_batch(
    step: int, batch: int, seq: int, vocab: int, seed: int, dp_rank: int, dp: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This data-parallel rank's share of step ``step``'s global batch."""
    x, y = global_batch(step, batch, seq, vocab, seed)
    n = batch // dp
    return x[dp_rank * n : (dp_rank + 1) * n], y[dp_rank * n : (dp_rank + 1) * n]
