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
  parameters (on gloo two all-reduces instead: ``zero1``; FSDP2's collectives too: ``gloo_comms``);
* ``none``  -- d = 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from simulator.cost.cache import IdentityCache
from simulator.cost.rank_view import rank_plan
from simulator.job import Job
from simulator.numeric import where
from simulator.plan import Plan
from simulator.runtime_spec import Runtime
from simulator.specs import ModelSpec

#: the data-parallel mechanisms, by the code :func:`dp_mode_code` gives (module docstring)
DP_MODES = ("fsdp", "ddp", "manual", "none")

#: the Runtime fields autoplan's program runs one way for every plan, whatever the command line
#: asks (their values are its profile's, autoplan/frameworks/profiles/autoplan.yaml); its profile's
#: other fields are defaults that --reduce-dtype and --zero3-runtime may override
PROGRAM_FIXED = ("cross_entropy", "states", "zero2", "offload", "grads_freed", "fsdp2_deferred_sync")


def dp_mode_code(zero: Any, d: Any, offload_cpu: Any, t: Any, p: Any, ep: Any) -> Any:
    """The index in :data:`DP_MODES` of the mechanism the program runs (module docstring) for
    ZeRO stage ``zero`` over ``d`` data-parallel ranks, offloading to the CPU or not, with
    ``t``, ``p`` and expert parallelism ``ep``: expert parallelism is ``manual`` (its experts'
    gradients average over other ranks than the rest's, autoplan.runtime.experts); ZeRO-2/3
    over d > 1 ranks or offloaded is ``fsdp``; d = 1 ``none``; ZeRO-0 without TP or PP ``ddp``;
    the rest ``manual``. Numbers or arrays alike (the search's plan columns)."""
    by_layout = where((t == 1) & (p == 1) & (zero == 0), 1, 2)
    unsharded = where(d == 1, 3, by_layout)
    return where(ep > 1, 2, where((zero >= 2) & ((d > 1) | offload_cpu), 0, unsharded))


def dp_mode(plan: Plan, ep: int = 1) -> str:
    """``fsdp``, ``ddp``, ``manual`` or ``none`` (see the module docstring and :func:`dp_mode_code`);
    ``plan`` as a rank sees it (d*cp ranks), ``ep`` the user plan's expert parallelism."""
    return DP_MODES[int(dp_mode_code(plan.zero, plan.d, plan.offload == "cpu", plan.t, plan.p, ep))]


def program_runtime(runtime: Runtime, mode: str, backend: str, tensor: bool = False, pipeline: bool = False) -> Runtime:
    """``runtime`` as the emitted program runs a plan whose data-parallel mechanism is ``mode``
    (:data:`DP_MODES`) on a ``backend`` ("nccl" or "gloo") node, with t > 1 (``tensor``) and
    p > 1 (``pipeline``) or not. What the program always does is its framework profile's
    (autoplan/frameworks/profiles/autoplan.yaml, each field citing the program's source): the
    :data:`PROGRAM_FIXED` fields of its ``runtime`` (loss ``F.cross_entropy(logits.float())``,
    fp32 parameters and gradients, ZeRO-2 and offload through FSDP2, gradients dropped at each
    step's start, FSDP2's gradient sync once a step under torch.distributed.pipelining) and its
    loss at t > 1 (``tensor_parallel_loss``: each rank's V/t logits,
    autoplan.runtime.vocab_parallel). What follows the plan is here:

    * DDP and FSDP2 reduce gradients bucket by bucket during the backward, the manual modes
      after the last backward (no overlap), and one data-parallel rank reduces nothing (no
      overlap either: so its plans and the manual mode's price as one batch group,
      autoplan.frameworks.pricing.runtime_groups);
    * on a GPU without FSDP, ``torch.autocast`` runs bf16 matmuls over fp32 parameters and keeps
      a bf16 copy of each weight from forward to backward (``weight_copy_bytes=2``), with an fp32
      residual stream and casts of every Linear's input and weight (``layer_kernels="eager"``,
      simulator.cost.eager_layer); FSDP2's MixedPrecisionPolicy gathers bf16 parameters instead
      (ZeRO-3's working set);
    * DDP holds a bucket copy of every gradient (``dp_buckets="all"``);
    * on gloo, ZeRO-1 and FSDP2 run their reduce-scatters and all-gathers as all-reduces
      (``scatter_gather="all-reduce"``: autoplan.runtime.zero1, autoplan.runtime.gloo_comms).
    """
    return _PROGRAM_RUNTIMES.get_or_make(
        (runtime,),
        (mode, backend, tensor, pipeline),
        lambda: _program_runtime(runtime, mode, backend, tensor, pipeline),
    )


#: program_runtime per runtime (by identity) and plan traits: each finalist of a search asks again
_PROGRAM_RUNTIMES = IdentityCache(256)


def _program_runtime(runtime: Runtime, mode: str, backend: str, tensor: bool, pipeline: bool) -> Runtime:
    from autoplan.frameworks import load_framework  # the profiles import nothing of the runtime

    program = load_framework("autoplan")
    profile = program.base_runtime()
    runtime = dataclasses.replace(runtime, **{key: getattr(profile, key) for key in PROGRAM_FIXED})
    if mode in ("manual", "none") and runtime.dp_overlap:  # none: no reduction to overlap
        runtime = dataclasses.replace(runtime, dp_overlap=False)
    autocast = backend == "nccl" and mode != "fsdp"
    runtime = dataclasses.replace(
        runtime,
        weight_copy_bytes=2.0 if autocast else 0.0,
        layer_kernels="eager" if autocast else "fused",
        dp_buckets="all" if mode == "ddp" else "in-flight",
        scatter_gather="all-reduce" if backend == "gloo" else "native",
    )
    return program.loss_runtime(runtime, tensor, pipeline)


def plan_program_runtime(runtime: Runtime, plan: Plan, backend: str) -> Runtime:
    """:func:`program_runtime` of ``plan``, its data-parallel group the d*cp ranks of the rank's plan."""
    return program_runtime(runtime, dp_mode(rank_plan(plan), plan.ep), backend, plan.t > 1, plan.p > 1)


def program_job(job: Job) -> Job:
    """``job`` as the emitted program runs it (:func:`plan_program_runtime`)."""
    return dataclasses.replace(job, runtime=plan_program_runtime(job.runtime, job.plan, job.cluster.node.backend))


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
