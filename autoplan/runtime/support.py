"""Which plans the runtime can run *correctly* on this torch version, and how it reduces
gradients (pure Python, no torch).

Anything refused here is refused by ``autoplan emit`` (exit 2) rather than run wrong.
What is supported and how: see ``autoplan.runtime.data_parallel`` (ZeRO), ``pipeline``
(schedules) and ``tensor_parallel`` (TP/SP).

``dp_mode`` picks the data-parallel mechanism for a plan:

* ``fsdp``  -- ZeRO-2 / ZeRO-3: FSDP2 ``fully_shard`` (``data_parallel.apply_fsdp``);
* ``ddp``   -- ZeRO-0 with pure data parallelism: ``DistributedDataParallel``;
* ``manual`` -- ZeRO-0 combined with TP or PP, where DDP does not work on this torch
  version: a bucketed all-reduce of the local gradient shards after the last backward; and
  ZeRO-1 for any layout: reduce-scatter of the gradients, shard step, all-gather of the
  parameters (``zero1``);
* ``none``  -- d = 1.
"""

from __future__ import annotations

import dataclasses

from simulator.cost.rank_view import rank_plan
from simulator.job import Job
from simulator.plan import Plan
from simulator.runtime_spec import NO_DP_OVERLAP
from simulator.specs import ModelSpec


def dp_mode(plan: Plan, ep: int = 1) -> str:
    """``fsdp``, ``ddp``, ``manual`` or ``none`` (see the module docstring); with expert
    parallelism ``ep`` > 1 ``manual``: the experts' gradients average over other ranks than the
    rest's (autoplan.runtime.experts)."""
    if ep > 1:
        return "manual"
    if plan.zero >= 2 and (plan.d > 1 or plan.offload == "cpu"):
        return "fsdp"
    if plan.d == 1:
        return "none"
    if plan.t == 1 and plan.p == 1 and plan.zero == 0:
        return "ddp"
    return "manual"


def program_job(job: Job) -> Job:
    """``job`` as the emitted program runs it (simulator.runtime_spec.Runtime):

    * DDP and FSDP2 reduce gradients bucket by bucket during the backward, the manual modes
      after the last backward (no overlap);
    * the loss is ``F.cross_entropy(logits.float())`` (``cross_entropy="torch"``);
    * parameters and gradients stay fp32, and ZeRO-1 keeps a full flat buffer and a master
      shard (``states="fp32-params"``, simulator.cost.memory.program_state_bytes);
    * on a GPU without FSDP, ``torch.autocast`` runs bf16 matmuls over fp32 parameters and keeps
      a bf16 copy of each weight from forward to backward (``weight_copy_bytes=2``), with an fp32
      residual stream and casts of every Linear's input and weight (``layer_kernels="eager"``,
      simulator.cost.eager_layer); FSDP2's
      MixedPrecisionPolicy gathers bf16 parameters instead (ZeRO-3's working set);
    * ZeRO-2 is FSDP2 with ``reshard_after_forward=False`` (``zero2="fsdp2"``,
      autoplan.runtime.data_parallel.apply_fsdp), not bucketed reduce-scatters.
    """
    runtime = job.runtime
    mode = dp_mode(rank_plan(job.plan), job.plan.ep)  # the program's data-parallel group: d*cp ranks
    if mode == "manual" and runtime.dp_overlap:
        runtime = NO_DP_OVERLAP
    autocast = job.cluster.node.backend == "nccl" and mode != "fsdp"
    runtime = dataclasses.replace(
        runtime,
        cross_entropy="torch",
        weight_copy_bytes=2.0 if autocast else 0.0,
        states="fp32-params",
        layer_kernels="eager" if autocast else "fused",
        zero2="fsdp2",
    )
    return dataclasses.replace(job, runtime=runtime)


def unsupported_reason(model: ModelSpec, plan: Plan, num_microbatches: int) -> str | None:
    """Why the runtime cannot run ``plan`` correctly, or None when it can."""
    if model.num_experts and plan.t > 1:
        return (
            f"t={plan.t} with a mixture of experts: its experts are not tensor-parallel in autoplan's program; "
            "use t=1 or the emitted Megatron-LM config"
        )
    if plan.ep > 1 and plan.zero > 0:
        return (
            f"ep={plan.ep} with zero={plan.zero}: its experts' gradients and states are reduced over their own "
            "replicas by hand, without ZeRO; use zero=0 or the emitted Megatron-LM config"
        )
    if plan.prec == "fp8":
        return (
            "prec=fp8: it computes in bf16 autocast (fp8 linears need Transformer Engine or torchao float8 on a "
            "Hopper GPU); use the emitted Megatron-LM or torchtitan config"
        )
    if plan.offload == "nvme":
        return "offload=nvme (ZeRO-Infinity) has no PyTorch implementation; use the emitted DeepSpeed config"
    if plan.offload == "cpu" and plan.zero != 3:
        return (
            f"offload=cpu with zero={plan.zero}: PyTorch offloads only through FSDP2's CPUOffloadPolicy, which "
            "moves parameters, gradients and optimizer state together (ZeRO-3); use zero=3 or the DeepSpeed config"
        )
    if plan.schedule not in ("gpipe", "1f1b", "interleaved", "zbh1", "zbv"):
        return f"schedule={plan.schedule} is not one of gpipe, 1f1b, interleaved, zbh1, zbv"
    rounds = max(1, num_microbatches // plan.p)
    if plan.schedule == "zbh1" and num_microbatches % rounds:
        return (
            f"schedule=zbh1: torch's zero-bubble schedule needs the {num_microbatches} microbatches to be a multiple "
            f"of its {rounds} rounds (m // p)"
        )
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
