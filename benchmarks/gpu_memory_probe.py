"""Two memory terms of autoplan's program, measured on a GPU.

1. The loss head: ``F.linear(h, W)`` under ``torch.autocast`` (bf16 logits) then
   ``F.cross_entropy(logits.float())``, as ``autoplan.runtime.model.lm_loss``: bytes per logit
   kept after the forward, at the forward's peak and at the backward's peak
   (simulator.cost.memory.logits_bytes_per_element, ``torch``).
2. Autocast's weight copies: 16 pairs of fp32 ``nn.Linear`` under autocast, without and with
   ``torch.utils.checkpoint``: bytes per parameter held after the forward, less the bf16 inputs
   the matmuls save (simulator.cost.stage_memory.weight_copies_held).

Needs CUDA; the figures of 2026-11-25 on an H100 are in ``benchmarks/data/h100-memory-probe.txt``::

    python benchmarks/gpu_memory_probe.py
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

TOKENS, HIDDEN, VOCAB, FFN, LAYERS = 8192, 2048, 128256, 8192, 16


def _mark() -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def head(rep: int) -> None:
    w = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, device="cuda") * 0.02)
    h = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, VOCAB, (TOKENS,), device="cuda")
    base = _mark()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = F.linear(h, w)
    loss = F.cross_entropy(logits.float(), y)
    del logits
    torch.cuda.synchronize()
    saved, fwd_peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - base
    n = TOKENS * VOCAB
    print(
        f"head rep{rep}: per logit: saved after fwd {saved / n:.2f} B, fwd peak {fwd_peak / n:.2f} B, "
        f"bwd peak over base {bwd_peak / n:.2f} B; W bf16 copy {VOCAB * HIDDEN * 2 / n:.3f} B/logit-equiv",
        flush=True,
    )


def autocast_copies(mode: str, rep: int, layers: torch.nn.ModuleList, x: torch.Tensor) -> None:
    params = sum(p.numel() for p in layers.parameters())
    for p in layers.parameters():
        p.grad = None
    base = _mark()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        z = x
        for layer in layers:
            z = checkpoint(layer, z, use_reentrant=False) if mode == "full" else layer(z)
    torch.cuda.synchronize()
    saved, fwd_peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
    acts = LAYERS * x.shape[0] * (FFN + HIDDEN) * 2  # the bf16 inputs each matmul saves (no recompute)
    z.float().sum().backward()
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - base
    print(
        f"autocast {mode} rep{rep}: params {params / 1e6:.0f}M; saved after fwd {saved / params:.3f} B/param "
        f"(bf16 acts if none: {acts / params:.3f}), fwd peak {fwd_peak / params:.3f} B/param, "
        f"bwd peak {bwd_peak / params:.3f} B/param (fp32 grads are 4)",
        flush=True,
    )


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_memory_probe: needs a CUDA device", file=sys.stderr)
        return 2
    for rep in range(2):
        head(rep)
    torch.cuda.empty_cache()
    layers = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(HIDDEN, FFN, bias=False), torch.nn.Linear(FFN, HIDDEN, bias=False))
        for _ in range(LAYERS)
    ).to("cuda")
    x = torch.randn(2048, HIDDEN, device="cuda", requires_grad=True)
    for mode in ("none", "full"):
        for rep in range(2):
            autocast_copies(mode, rep, layers, x)
    return 0


if __name__ == "__main__":
    sys.exit(main())
