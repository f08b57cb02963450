"""The optimizer step on a GPU: calibrate's per-parameter figure, and AdamW's step memory.

Prints ``hwprofiles.calibrate.eager.optimizer_param_time`` on CUDA, then for torch's AdamW
(``foreach=True``, the default on CUDA, and ``fused=True``) with ``clip_grad_norm_`` over 4 x 2^26
fp32 parameters: the peak allocation during the step above the states, per parameter (foreach
keeps one fp32 temporary per parameter: ``torch._foreach_sqrt`` of the second moments in
``torch/optim/adamw.py``'s multi-tensor path), and the step time per parameter. Needs CUDA; the
figures of 2026-11-25 on an H100 are in ``benchmarks/data/h100-optimizer-probe.txt``::

    python benchmarks/gpu_optimizer_probe.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hwprofiles.calibrate.eager import optimizer_param_time

ELEMENTS, TENSORS, TIMED = 1 << 26, 4, 10


def probe(impl: str) -> tuple[float, float]:
    """(step bytes above the states per parameter, step seconds per parameter) of AdamW(impl=True)."""
    params = [torch.zeros(ELEMENTS, device="cuda", requires_grad=True) for _ in range(TENSORS)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4, **{impl: True})

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    step()  # the moments are allocated at the first step
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    t0 = time.perf_counter()
    for _ in range(TIMED):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / TIMED
    n = ELEMENTS * TENSORS
    return extra / n, seconds / n


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_optimizer_probe: needs a CUDA device", file=sys.stderr)
        return 2
    print("optimizer_param_ns (new calibrate size)", optimizer_param_time("cuda", 5, 0.0) * 1e9)
    for impl in ("foreach", "fused"):
        extra, seconds = probe(impl)  # its tensors are freed on return
        torch.cuda.empty_cache()
        print(impl, "step transient bytes/param", extra, "ns/param", seconds * 1e9)
    return 0


if __name__ == "__main__":
    sys.exit(main())
