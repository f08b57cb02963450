"""Which plans the runtime can run *correctly* on this torch version (pure Python, no torch).

Anything refused here is refused by ``autoplan emit`` (exit 2) rather than run wrong.
What is supported and how: see ``autoplan.runtime.data_parallel`` (ZeRO), ``pipeline``
(schedules) and ``tensor_parallel`` (TP/SP).
"""

from __future__ import annotations

from typing import Optional

from simulator.specs import ModelSpec, Plan


def unsupported_reason(model: ModelSpec, plan: Plan, num_microbatches: int) -> Optional[str]:
    """Why the runtime cannot run ``plan`` correctly, or None when it can."""
    if plan.offload == "nvme":
        return "offload=nvme (ZeRO-Infinity) has no PyTorch implementation; use the emitted DeepSpeed config"
    if plan.offload == "cpu" and plan.zero != 3:
        return (f"offload=cpu with zero={plan.zero}: PyTorch offloads only through FSDP2's CPUOffloadPolicy, which "
                "moves parameters, gradients and optimizer state together (ZeRO-3); use zero=3 or the DeepSpeed config")
    if plan.schedule not in ("gpipe", "1f1b", "interleaved"):
        return f"schedule={plan.schedule} is not one of gpipe, 1f1b, interleaved"
    stages = plan.p * plan.v
    if plan.p > 1 and plan.schedule == "1f1b" and num_microbatches < stages:
        return f"schedule=1f1b needs at least as many microbatches as stages ({num_microbatches} < {stages})"
    if plan.p > 1 and plan.schedule == "interleaved" and num_microbatches % plan.p:
        return f"schedule=interleaved needs the {num_microbatches} microbatches to be a multiple of p={plan.p}"
    sizes = plan.chunk_layers(model.num_layers)
    if len(sizes) != stages or min(sizes) < 1:
        return f"every one of the p*v = {stages} pipeline chunks needs at least one layer"
    if plan.sp and plan.t > 1 and model.seq_length % plan.t:
        return f"sp=1 needs t={plan.t} to divide seq_length={model.seq_length}"
    return None
