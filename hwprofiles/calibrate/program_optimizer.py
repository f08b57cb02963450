"""The optimizer autoplan's program steps (autoplan/runtime/trainer.py), in one home, so that
``autoplan calibrate`` times the implementation the program runs (hwprofiles.calibrate.eager).

torch's fused AdamW on every device (CUDA, and CPU since torch 2.4), one op per parameter group:

* on a GPU, torch's default (foreach) allocates one fp32 temporary per parameter at the step
  (``torch._foreach_sqrt`` of the second moments), 4 bytes per parameter over the states, and
  steps 2.2x slower (H100, benchmarks/data/h100-optimizer-probe.txt);
* on a CPU rank torch's default is the per-tensor loop, about a dozen ops per tensor, each a
  DTensor dispatch under FSDP2 (benchmarks/cpu_optimizer_probe.py, torch 2.13 CPU, 2 gloo ranks,
  2026-11-27, benchmarks/data/cpu-optimizer-probe.txt): per tensor of a block of Linear(h, 4h),
  Linear(4h, h) and LayerNorm(h), at h = 16 381 us against 35 fused over FSDP2's parameters and
  59 against 9 over plain ones; at h = 512 (mostly the 2^20-element weights' arithmetic) 1937
  against 511 us over plain ones;
* offloaded (the state on the host), the fused CPU kernel, one multi-threaded pass per tensor.

A fused (or foreach) op takes DTensors or plain tensors, not both ("got mixed torch.Tensor and
DTensor"), so DTensor and plain parameters go in separate groups (:func:`param_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def param_groups(params: Sequence[torch.Tensor]) -> list[dict[str, Any]]:
    """DTensor and plain parameters in separate groups (a fused op cannot mix them)."""
    from torch.distributed.tensor import DTensor

    dt = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    return [{"params": g} for g in (dt, plain) if g]


def program_adamw(params: Sequence[torch.Tensor], **hyper: Any) -> torch.optim.AdamW:
    """torch's fused AdamW over ``params`` (grouped by :func:`param_groups`) with the
    hyperparameters ``hyper`` (lr, betas, eps, weight_decay)."""
    return torch.optim.AdamW(param_groups(params), fused=True, **hyper)
