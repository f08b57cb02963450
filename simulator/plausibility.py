"""Plausibility of a prediction: the best MFU published for the GPU class, for comparison.

A planner that promises more than anyone has measured on that hardware should say so. The
figures are the best bf16 model-FLOPs utilization among the published runs autoplan is checked
against (validation/published-fsdp.yaml, validation/published.yaml), each with its run and source.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwprofiles.schema import GpuProfile


@dataclass(frozen=True)
class PublishedMfu:
    """The best published MFU of one GPU class."""

    gpu_class: str
    mfu: float  # model FLOPs / (time * GPUs * dense bf16 peak)
    run: str
    source: str


PUBLISHED_BEST: dict[str, PublishedMfu] = {
    "a100": PublishedMfu(
        "A100",
        0.611,
        "Llama 2 13B, FSDP2 on 64 A100 80GB, seq 4096, no recomputation",
        "pytorch/torchtitan docs/performance.md (validation/published-fsdp.yaml)",
    ),
    "h100": PublishedMfu(
        "H100",
        0.499,
        "GPT-3 175B, t=4 p=8 v=12 on 128 H100, bf16",
        "NVIDIA DGX Cloud benchmarking recipes v24.11.1 (validation/published-fsdp.yaml)",
    ),
    "h200": PublishedMfu(
        "H200 (H100's figure: same SMs and peak)",
        0.499,
        "GPT-3 175B, t=4 p=8 v=12 on 128 H100, bf16",
        "NVIDIA DGX Cloud benchmarking recipes v24.11.1 (validation/published-fsdp.yaml)",
    ),
}


def published_best(gpu: GpuProfile) -> PublishedMfu | None:
    """The best published MFU for ``gpu``'s class (by profile name: a100-*, h100-*, h200-*), or
    None for a class without a published run here (V100, CPUs)."""
    return PUBLISHED_BEST.get(gpu.name.split("-")[0])


def kernel_ceiling(gpu: GpuProfile) -> float:
    """The largest fraction of peak any kernel of a layer reaches on ``gpu``: its GEMMs'
    ``max_efficiency`` (attention and elementwise kernels reach less). No plan's MFU can exceed it."""
    return gpu.gemm.max_efficiency
