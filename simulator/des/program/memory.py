"""Static memory of every simulated rank: what it holds for the whole iteration.

Model states (ZeRO, offload: :func:`simulator.cost.memory.model_state_bytes`, the program's
bytes per parameter: :func:`simulator.cost.state_bytes.program_state_bytes`), gradient buckets
(:func:`simulator.cost.memory.gradient_bucket_bytes`) and pipeline send/receive buffers
(:func:`simulator.cost.boundary.pipeline_buffer_bytes`), the program's compute-dtype weight
copies that its backward holds (:func:`simulator.cost.phase_memory.weight_copies_saved`; the
forward's others are the head's forward transient, simulator.des.passes) and fp8 weight copies
(:func:`simulator.cost.stage_memory.fp8_weight_copies`): the terms of
:func:`simulator.cost.stage_memory.stage_memory` that do not change during the step.
"""

from __future__ import annotations

from simulator.cost.boundary import pipeline_buffer_bytes
from simulator.cost.fsdp2_sync import plan_deferred_sync, whole_grad_bytes, zero2_unsharded_bytes
from simulator.cost.memory import ModelStates, gradient_bucket_bytes, model_state_bytes
from simulator.cost.phase_memory import gradients_late, weight_copies_held
from simulator.cost.stage_memory import fp8_weight_copies
from simulator.cost.state_bytes import program_state_bytes
from simulator.des.program.state import Device, Program


def late_gradients(prog: Program) -> bool:
    """Whether the rank's gradients appear only at its one microbatch's backward's end
    (simulator.cost.phase_memory.gradients_late); :func:`add_late_gradients` adds them there."""
    plan = prog.plan
    return bool(gradients_late(prog.job.runtime.grads_freed, prog.m, plan.p, plan.d, plan.zero))


def add_late_gradients(prog: Program) -> None:
    """With :func:`late_gradients`, each device's gradients at the end of its backward's last task
    (the activations it freed are gone by then, frees coming before allocations at one instant)."""
    if not late_gradients(prog):
        return
    for dev in prog.devices:
        prog.mem.add(prog.last[(dev.idx, "B", 0, 0)], dev.idx, True, "grads", device_states(prog, dev).grads)


def device_states(prog: Program, dev: Device) -> ModelStates:
    """The model states one rank of ``dev`` holds (simulator.cost.memory.model_state_bytes), in
    the program's bytes per parameter."""
    plan, runtime = prog.plan, prog.job.runtime
    states = program_state_bytes(runtime.states, prog.costs.e, plan.zero, runtime.scatter_gather)
    psi = prog.device_params(dev)
    whole = whole_grad_bytes(plan_deferred_sync(plan, runtime), runtime, prog.costs.e)  # sharded after the step
    unsharded = zero2_unsharded_bytes(plan.d, plan.zero, runtime, prog.costs.e)
    return model_state_bytes(
        psi, plan.shard_group, plan.zero, plan.offload, *states, prog.device_sharded_params(dev), whole, unsharded
    )


def add_static_memory(prog: Program) -> None:
    plan, c = prog.plan, prog.costs
    model = prog.job.model
    pipe_buffers = pipeline_buffer_bytes(model, plan.mb, c.e, plan.p)
    grad_bytes = program_state_bytes(prog.job.runtime.states, c.e, plan.zero)[1]
    for dev in prog.devices:
        psi = prog.device_params(dev)
        ms = device_states(prog, dev)
        prog.mem.add_static(dev.idx, "params", ms.params)
        if not late_gradients(prog):
            prog.mem.add_static(dev.idx, "grads", ms.grads)
        prog.mem.add_static(dev.idx, "optimizer", ms.optimizer)
        if plan.d > 1 or plan.offload != "none":
            every = prog.job.runtime.dp_buckets == "all"
            prog.mem.add_static(dev.idx, "buffers", gradient_bucket_bytes(psi, prog.bucket_bytes, grad_bytes, every))
        if pipe_buffers:
            prog.mem.add_static(dev.idx, "buffers", pipe_buffers)
        if prog.job.runtime.weight_copy_bytes:
            held = weight_copies_held(prog.job.runtime.weight_copy_bytes, psi)
            prog.mem.add_static(dev.idx, "buffers", held - c.copies_unsaved)
        fp8 = fp8_weight_copies(model, plan, prog.device_layers(dev), c.e)
        if fp8:
            prog.mem.add_static(dev.idx, "buffers", fp8)
