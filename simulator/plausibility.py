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


#: the best fp8 MFU published (model FLOPs over the dense fp8 peak, as NVIDIA reports fp8 runs)
PUBLISHED_BEST_FP8: dict[str, PublishedMfu] = {
    "h100": PublishedMfu(
        "H100, fp8",
        888 / 1979,
        "GPT-3 175B, t=4 p=8 v=6 on 512 H100, fp8: 888 TFLOP/s per GPU",
        "NVIDIA NeMo performance summary 24.07 (validation/published-fsdp.yaml)",
    ),
}
PUBLISHED_BEST_FP8["h200"] = PUBLISHED_BEST_FP8["h100"]


def published_best(gpu: GpuProfile, prec: str = "bf16") -> PublishedMfu | None:
    """The best published MFU for ``gpu``'s class (by profile name: a100-*, h100-*, h200-*) in
    the plan's precision ``prec``, or None for a class without a published run here (V100, CPUs)."""
    table = PUBLISHED_BEST_FP8 if prec == "fp8" else PUBLISHED_BEST
    return table.get(gpu.name.split("-")[0])


def kernel_ceiling(gpu: GpuProfile, prec: str = "bf16") -> float:
    """The largest fraction of peak any kernel of a layer reaches on ``gpu``: its GEMMs'
    ``max_efficiency`` (attention and elementwise kernels reach less), for prec=fp8 the fp8
    GEMMs' over the fp8 peak (the bf16 kernels of an fp8 plan reach at most half of that). No
    plan's MFU (over its precision's peak, simulator.result.SimResult.mfu) can exceed it."""
    if prec == "fp8" and gpu.gemm.fp8 is not None:
        return max(gpu.gemm.fp8.max_efficiency, gpu.gemm.max_efficiency * gpu.peak_flops() / gpu.peak_flops("fp8"))
    return gpu.gemm.max_efficiency
