"""FSDP2's host time on a CPU rank, in units of the host's per-op time (simulator.cost.zero3.
FSDP2_HOST_OPS), and the AdamW step over its DTensor parameters against plain ones.

    torchrun --standalone --nproc-per-node 1 benchmarks/fsdp_host_probe.py

One gloo rank (world 1: the collectives are trivial, what remains is FSDP2's hooks). Models of
``units`` blocks of ``n`` bias-free Linear(64, 64) each, trained plain and under ``fully_shard``
per block and the root with ``reshard_after_forward`` True (ZeRO-3) or False (ZeRO-2), as
autoplan/runtime/data_parallel.py applies it. Per microbatch, the extra forward+backward time
over the plain model is fitted as units * (a + b * n); in the same process a chain of tiny ops'
forward+backward gives the per-op time (calibrate's ``kernel_launch_us``: backward counted as
two ops), and a and b are printed in those op units. Medians of interleaved rounds, so that the
host's load moves both alike. Not run in CI.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from hwprofiles.calibrate.program_optimizer import program_adamw

UNITS, SIZES, ITERS, ROUNDS = 8, (1, 4, 16), 30, 3


def per_op_s() -> float:
    """Seconds per op of a forward+backward of 64 tiny ops (backward counted as 2 ops each)."""
    x = torch.ones(4, requires_grad=True)
    best = []
    for _ in range(ITERS):
        t0 = time.perf_counter()
        y = x
        for _ in range(64):
            y = y * 1.0001
        y.sum().backward()
        best.append((time.perf_counter() - t0) / (3 * 64))
    return statistics.median(best)


def model(n: int, mesh: object | None, reshard: bool) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(*[nn.Linear(64, 64, bias=False) for _ in range(n)]) for _ in range(UNITS)])
    if mesh is not None:
        for block in m:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    return m


def timings(m: nn.Module) -> tuple[float, float]:
    """Median seconds of a forward+backward and of an AdamW step (the program's fused AdamW)."""
    opt = program_adamw(list(m.parameters()), lr=1e-4)
    x = torch.randn(8, 64)
    fb, st = [], []
    for k in range(ITERS + 3):
        for p in m.parameters():
            p.grad = None
        t0 = time.perf_counter()
        m(x).sum().backward()
        t1 = time.perf_counter()
        opt.step()
        if k >= 3:
            fb.append(t1 - t0)
            st.append(time.perf_counter() - t1)
    return statistics.median(fb), statistics.median(st)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    extra: dict[tuple[str, int], list[float]] = {}
    opt_ratio: list[float] = []
    ops: list[float] = []
    for _ in range(ROUNDS):
        for n in SIZES:
            plain_fb, plain_opt = timings(model(n, None, False))
            for name, reshard in (("zero3", True), ("zero2", False)):
                fb, opt = timings(model(n, mesh, reshard))
                extra.setdefault((name, n), []).append((fb - plain_fb) / UNITS)
                opt_ratio.append(opt / plain_opt)
            ops.append(per_op_s())
    op = statistics.median(ops)
    print(
        f"per-op time {op * 1e6:.2f} us; AdamW step over FSDP2 (DTensor) parameters / plain: "
        f"{statistics.median(opt_ratio):.2f}x"
    )
    for name in ("zero3", "zero2"):
        ys = [statistics.median(extra[(name, n)]) for n in SIZES]
        a, b = fit([float(n) for n in SIZES], ys)
        per_unit = ", ".join(f"n={n}: {y * 1e6:.0f} us" for n, y in zip(SIZES, ys))
        print(
            f"{name}: FSDP2 host time per unit and microbatch {per_unit}; "
            f"fit {a / op:.0f} + {b / op:.1f} * tensors op units ({a * 1e6:.0f} us + {b * 1e6:.1f} us/tensor)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
