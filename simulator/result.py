"""The result of simulating one iteration: the JSON of docs/design.md section 3."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hwprofiles.units import GiB  # also imported from here (simulator.des.plot, simulator.des.trace)
from simulator.job import Job
from simulator.plausibility import published_best

TIME_KEYS = (
    "compute",
    "recompute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_comm",
    "dp_comm",
    "bubble",
    "offload",
    "optimizer",
)
MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "buffers")


@dataclass
class SimResult:
    """One iteration's prediction. Times in seconds, memory in bytes (reported in GiB).

    ``time_breakdown`` adds up to ``step_time`` (critical path of the slowest stage);
    ``memory_breakdown`` is the peak rank's memory at its peak.
    """

    job: Job
    step_time: float
    peak_memory: float
    memory_capacity: float
    time_breakdown: dict[str, float]
    memory_breakdown: dict[str, float]
    executed_flops: float
    model_flops: float
    bubble_fraction: float
    fidelity: str
    extra: dict[str, Any] = field(default_factory=dict)
    host_fits: bool = True  # offloaded state fits in host memory

    @property
    def fits(self) -> bool:
        return self.peak_memory <= self.memory_capacity and self.host_fits

    @property
    def tflops_per_gpu(self) -> float:
        """Executed FLOPs (recomputation included) / (step time * GPUs) (docs/design.md section 3)."""
        return self.executed_flops / (self.step_time * self.job.cluster.num_gpus) / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs (no recomputation) / (step time * GPUs * peak), the peak of the plan's GEMM
        dtype: the fp8 peak for prec=fp8 (as NVIDIA's fp8 recipes report MFU), else the default's."""
        peak = self.job.cluster.gpu.peak_flops("fp8" if self.job.plan.prec == "fp8" else None)
        return self.model_flops / (self.step_time * self.job.cluster.num_gpus * peak)

    @property
    def tokens_per_s(self) -> float:
        return self.job.global_batch * self.job.seq / self.step_time

    def to_dict(self) -> dict[str, Any]:
        out = {
            "plan": self.job.plan.to_dict(self.job.m),
            "model": self.job.model.name,
            "cluster": self.job.cluster.name,
            "gpus": self.job.cluster.num_gpus,
            "global_batch": self.job.global_batch,
            "seq_length": self.job.seq,
            "step_time_s": self.step_time,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory / GiB,
            "memory_capacity_gib": self.memory_capacity / GiB,
            "fits": self.fits,
            "memory_breakdown_gib": {k: self.memory_breakdown.get(k, 0.0) / GiB for k in MEMORY_KEYS},
            "time_breakdown_s": {k: self.time_breakdown.get(k, 0.0) for k in TIME_KEYS},
            "bubble_fraction": self.bubble_fraction,
            "fidelity": self.fidelity,
            "runtime": self.job.runtime.name,  # the framework that runs it, with the command line's overrides
            "dp_overlap": self.job.runtime.dp_overlap,
            "zero3_runtime": self.job.runtime.zero3,
            "attention": self.job.model.attention,
        }
        headroom = self.job.cluster.gpu.memory_headroom_GiB
        if headroom:  # --memory-headroom: already out of memory_capacity_gib
            out["memory_headroom_gib"] = headroom
        best = published_best(self.job.cluster.gpu, self.job.plan.prec)
        if best is not None:
            out["published_best_mfu"] = {"gpu": best.gpu_class, "mfu": best.mfu, "run": best.run, "source": best.source}
        out.update({k: v for k, v in self.extra.items() if not k.startswith("_")})
        return out
