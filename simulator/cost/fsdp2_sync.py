"""Which plans FSDP2 shards, when it reduces their gradients and in what dtype (the rules that
the time and the memory models both read; simulator.cost.zero3 prices the traffic)."""

from __future__ import annotations

from typing import Any

from simulator.cost import state_bytes
from simulator.numeric import where
from simulator.plan import Plan
from simulator.runtime_spec import Runtime


def reduce_bytes(runtime: Runtime, e: int) -> int:
    """Bytes per gradient element of a ZeRO-2/3 reduce-scatter (FSDP2's, DeepSpeed's): the
    runtime's reduce dtype, never below the training dtype's (a fp32 run reduces in fp32)."""
    return max(e, runtime.sharded_reduce_bytes)


def fsdp2_sharded(plan: Plan, runtime: Runtime) -> bool:
    """Does the runtime shard the plan's parameters with FSDP2's ``fully_shard`` (each unit
    gathered before use and its gradients reduce-scattered after its backward, every microbatch,
    or once a step under a pipeline: :func:`deferred_sync`): ZeRO-3 under the "fsdp2" runtime,
    ZeRO-2 where it runs as FSDP2 (``Runtime.zero2``, autoplan/runtime/data_parallel.py
    ``apply_fsdp``), over d > 1 ranks."""
    return bool(fsdp2_sharded_by(plan.d, plan.zero, runtime))


def fsdp2_sharded_by(d: Any, zero: Any, runtime: Runtime) -> Any:
    """:func:`fsdp2_sharded` of data-parallel degrees ``d`` and ZeRO stages ``zero``, numbers or
    numpy arrays alike (the batch estimate's plan columns)."""
    return (d > 1) & (((zero >= 3) & (runtime.zero3 == "fsdp2")) | ((zero == 2) & (runtime.zero2 == "fsdp2")))


def fsdp2_wrapped_by(d: Any, zero: Any, offloaded: Any, runtime: Runtime) -> Any:
    """Does the runtime wrap a stage's units in FSDP2's ``fully_shard``: where it shards them
    (:func:`fsdp2_sharded_by`), and where it offloads ZeRO-2/3 through FSDP2's
    ``CPUOffloadPolicy`` (``Runtime.offload`` "fsdp2"), which takes ``fully_shard`` over a single
    rank too (autoplan/runtime/support.py ``dp_mode_code``: ZeRO-2/3 offloaded runs as fsdp at
    d = 1). ``offloaded``: the plans offload to the host. Numbers or arrays alike."""
    return fsdp2_sharded_by(d, zero, runtime) | ((zero >= 2) & offloaded & (runtime.offload == "fsdp2"))


def deferred_sync(p: Any, fsdp2: Any, runtime: Runtime) -> Any:
    """Does FSDP2 reduce a stage's gradients once per step and keep its parameters unsharded after
    each backward: under a pipeline (p > 1) of a runtime that pipelines with
    ``torch.distributed.pipelining`` (``Runtime.fsdp2_deferred_sync``: autoplan's program,
    torchtitan). Its stages turn FSDP2's gradient sync and its reshard after backward off for
    every microbatch's backward
    (torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``:
    ``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)``; the unsharded
    gradients accumulate) and, after the stage's last backward, reduce-scatter every unit's
    gradients (``perform_reduce_grad``). ``fsdp2``: the stage wrapped in FSDP2
    (:func:`fsdp2_wrapped_by`). Counted in autoplan's program:
    benchmarks/data/fsdp2-pipeline-probe-2026-11-29.txt. Numbers or arrays alike."""
    return fsdp2 & (p > 1) & runtime.fsdp2_deferred_sync


def deferred_sync_by(p: Any, d: Any, zero: Any, offloaded: Any, runtime: Runtime) -> Any:
    """:func:`deferred_sync` of plans with these fields (``offloaded``: they offload to the host),
    wrapped in FSDP2 as :func:`fsdp2_wrapped_by` says. Numbers or arrays alike."""
    return deferred_sync(p, fsdp2_wrapped_by(d, zero, offloaded, runtime), runtime)


def plan_deferred_sync(plan: Plan, runtime: Runtime) -> bool:
    """:func:`deferred_sync` of one plan under ``runtime``."""
    return bool(deferred_sync_by(plan.p, plan.d, plan.zero, plan.offload != "none", runtime))


def zero2_unsharded_bytes(d: Any, zero: Any, runtime: Runtime, e: int) -> Any:
    """Bytes per parameter of the unsharded copy FSDP2's ZeRO-2 keeps beside each rank's shard
    (``reshard_after_forward=False``: a unit gathered for its forward stays so through its
    backward, autoplan/runtime/data_parallel.py ``apply_fsdp``), in the compute dtype its
    MixedPrecisionPolicy gathers, ``e`` bytes (bf16 on a GPU, fp32 without mixed precision); 0
    where ZeRO-2 does not run as FSDP2 (:func:`fsdp2_sharded_by`). Numbers or arrays alike."""
    return where(fsdp2_sharded_by(d, zero, runtime) & (zero == 2), float(e), 0.0)


def zero3_gathered_bytes(working_set: Any, psi: Any, deferred: Any, e: int) -> Any:
    """ZeRO-3's gathered parameters at a stage's peak: the ``working_set``
    (simulator.cost.memory.zero3_working_set_bytes), or, with the sync deferred (:func:`deferred_sync`:
    each unit stays unsharded after its backward), all ``psi`` parameters of the stage at
    state_bytes.param_gather_bytes(e) each (its last backwards leave every unit gathered). Numbers or
    arrays alike."""
    return where(deferred, psi * state_bytes.param_gather_bytes(e), working_set)


def whole_grad_bytes(deferred: Any, runtime: Runtime, e: int) -> Any:
    """Bytes per parameter of the gradients a stage accumulates whole through the step, on the
    device, offloaded or not: with the sync deferred (:func:`deferred_sync`) FSDP2 keeps each
    unsharded gradient and, where its parameters compute in another dtype, accumulates it in the
    reduce dtype (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    ``to_accumulated_grad_if_needed``: ``unsharded_grad.to(self.reduce_dtype)``), :func:`reduce_bytes`;
    0 without. Numbers or arrays alike."""
    return where(deferred, float(reduce_bytes(runtime, e)), 0.0)
