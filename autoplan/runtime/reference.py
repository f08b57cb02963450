"""The single-process reference: same model, seed and data, no parallelism at all.

One forward over the whole global batch per step, mean loss, backward, then plain SGD
(the equivalence check) with the global gradient norm recorded. fp32 on CPU.
"""

from __future__ import annotations

import torch

from autoplan.runtime.config import RunSpec
from autoplan.runtime.data import global_batch
from autoplan.runtime.init import init_parameters
from autoplan.runtime.model import GPT, layer_recompute, lm_loss


def reference_losses(spec: RunSpec, steps: int) -> dict[str, list[float]]:
    """Losses and gradient norms of ``steps`` SGD steps of the unparallelized model."""
    m, plan = spec.model, spec.plan
    modes = layer_recompute(m, plan.chunk_layers(m.num_layers), plan.chunk_recompute(m.num_layers))
    model = GPT(m, range(m.num_layers), True, True, modes)
    init_parameters(model, spec.train.seed, spec.train.init_std, m.tie_embeddings)
    opt = torch.optim.SGD(model.parameters(), lr=spec.train.check_lr)
    losses, norms = [], []
    for step in range(steps):
        x, y = global_batch(step, spec.global_batch, m.seq_length, m.vocab_size, spec.train.seed)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        sq = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(float(loss.detach()))
        norms.append(sq**0.5)
    return {"losses": losses, "grad_norms": norms}
