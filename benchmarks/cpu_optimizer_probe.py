"""torch's AdamW implementations on CPU ranks, over plain parameters and over FSDP2's (DTensor)
parameters: seconds per parameter tensor of one step.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 benchmarks/cpu_optimizer_probe.py

Each rank builds 8 blocks of Linear(h, 4h), Linear(4h, h) and LayerNorm(h) (6 tensors a
block), plain or under ``fully_shard`` per block and the root as autoplan's program applies it
(autoplan/runtime/data_parallel.py), runs one backward, then times ``AdamW.step`` with torch's
default (on a CPU: the per-tensor loop, about a dozen ops per tensor), ``foreach=True`` and
``fused=True``, at h = 16 (the per-tensor host work) and h = 512 (the per-parameter work).
Medians of the timed steps, rank 0 printed. Why autoplan's program steps the fused AdamW on a
CPU rank too (autoplan/runtime/trainer.py). Not run in CI.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

BLOCKS, STEPS, SKIP = 8, 30, 5
IMPLEMENTATIONS: dict[str, dict[str, bool]] = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def blocks(h: int, mesh: object | None) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(
        *[nn.Sequential(nn.Linear(h, 4 * h), nn.Linear(4 * h, h), nn.LayerNorm(h)) for _ in range(BLOCKS)]
    )
    if mesh is not None:
        for block in m:
            fully_shard(block, mesh=mesh)
        fully_shard(m, mesh=mesh)
    return m


def seconds_per_tensor(m: nn.Module, h: int, options: dict[str, bool]) -> float:
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, **options)
    m(torch.randn(4, h)).sum().backward()
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[SKIP:]) / len(list(m.parameters()))


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    lines = []
    for h in (16, 512):
        for sharded in (False, True):
            cells = [
                f"{name} {seconds_per_tensor(blocks(h, mesh if sharded else None), h, options) * 1e6:8.1f}"
                for name, options in IMPLEMENTATIONS.items()
            ]
            lines.append(f"h={h:<4} {'fsdp2' if sharded else 'plain':<6} us/tensor: " + "  ".join(cells))
    if dist.get_rank() == 0:
        print(f"torch {torch.__version__}, {world} gloo ranks, one thread each")
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
