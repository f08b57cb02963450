"""What a device holds beside its lasting memory in one phase of a step, and when a step's
gradients come (simulator.cost.stage_memory's transient term; docs/design.md section 4, "Memory").

A step's microbatch passes through three phases that never hold their transients at once: the
forward's end (the program's autocast weight copies, the loss forward's fp32 logits), the loss
backward (its gradients) and a fully recomputed layer's recompute (its full activations). Each
rule takes numbers or arrays alike (simulator.numeric), for one plan or for the batch estimate's
many; the DES allocates the same terms with the passes that hold them (simulator.des.passes).
"""

from __future__ import annotations

from typing import Any

from simulator.numeric import maximum, where


def weight_copies_held(weight_copy_bytes: float, stage_params: Any) -> Any:
    """The program's compute-dtype weight copies at the forward's end (simulator.runtime_spec.Runtime.
    weight_copy_bytes per parameter of the stage). Autocast caches a weight's bf16 copy until
    its context exits: autoplan's program holds one context over the whole pipeline schedule
    (p > 1) and, without a pipeline, one over each microbatch's forward, at whose end every
    copy is alive beside the checkpoints and the logits. Measured on an H100
    (benchmarks/data/h100-memory-probe.txt): 2.0 bytes per parameter held after an autocast
    forward, and at its end with recomputation too. The embedding table, which autocast does not
    cast, is counted as well: V*h*weight_copy_bytes too many on a first stage that does not also
    hold the tied head."""
    return weight_copy_bytes * stage_params


def weight_copies_saved(weight_copy_bytes: float, stage_params: Any, full_layer_params: Any, pipelined: Any) -> Any:
    """The copies of :func:`weight_copies_held` that the backward still holds: those the matmuls
    saved, all but a fully recomputed layer's (its checkpoint saves none; it casts again when
    recomputed) once a non-pipelined program's autocast context has exited after the forward;
    under a pipeline (``pipelined``) the context spans the schedule and keeps them all
    (autoplan/runtime/trainer.py ``_forward_backward``). ``full_layer_params``: the parameters of
    the stage's fully recomputed layers. Numbers or arrays alike."""
    return weight_copy_bytes * where(pipelined, stage_params, stage_params - full_layer_params)


def phase_transient(
    copies_all: Any, copies_saved: Any, loss_forward: Any, loss_backward: Any, recompute: Any
) -> tuple[Any, Any]:
    """(activations, buffers) that a device holds at its peak beyond its lasting terms: the
    largest of the three phases of a microbatch on it,
        forward's end:  copies_all + loss_forward
        loss backward:  copies_saved + loss_backward
        recompute:      copies_saved + recompute
    with the weight copies (:func:`weight_copies_held`, :func:`weight_copies_saved`), the loss's
    transient on the last stage (simulator.cost.memory.loss_transient_bytes) and a fully
    recomputed layer's full activations while it is recomputed and back-propagated
    (:func:`recompute_working_set`). The loss backward and a layer's recompute never overlap: the
    head's backward has freed the loss's gradients before the last layer recomputes. The
    recompute's share is activations, the rest buffers. Numbers or arrays alike."""
    forward = copies_all + loss_forward
    backward = copies_saved + maximum(loss_backward, recompute)
    recomputing = (recompute > loss_backward) & (backward >= forward)
    activations = where(recomputing, recompute, 0.0)
    return activations, maximum(forward, backward) - activations


def recompute_working_set(full_layers: Any, per_none: Any) -> Any:
    """One layer's full activations (``per_none``: :func:`layer_activations`) while a fully
    recomputed layer is recomputed and back-propagated, on a stage that holds any
    (``full_layers`` > 0). Numbers or arrays alike."""
    return where(full_layers > 0, per_none, 0.0)


def gradients_late(grads_freed: bool, m: Any, p: Any, d: Any, zero: Any) -> Any:
    """Whether a step's gradients exist only after its microbatch's activations are gone: a
    program that drops its ``.grad`` each step (simulator.runtime_spec.Runtime.grads_freed) with
    one microbatch (m = 1) on one unsharded, unreplicated stage (p = 1, d = 1, ZeRO-0), whose
    single backward allocates each layer's gradients as it frees that layer's activations. With
    more microbatches the first one's gradients meet the next one's activations; a pipeline's,
    DDP's buckets and ZeRO's shards are held through the step. Numbers or arrays alike."""
    return grads_freed & (m == 1) & (p == 1) & (d == 1) & (zero == 0)
