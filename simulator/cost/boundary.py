"""The activation at a pipeline boundary: what a stage sends the next one per microbatch and the
buffers it keeps for it (simulator.analytic.pipeline, simulator.des.program.pipeline and the
stage memory models read it)."""

from __future__ import annotations

from simulator.specs import ModelSpec


def boundary_activation_bytes(model: ModelSpec, b: int, e: int) -> int:
    """Bytes of one microbatch's activation at a layer boundary, b*s*h elements of e bytes: what
    a pipeline send carries before any split over the TP ranks (Megatron-LM
    p2p_communication's ``tensor_shape = (seq_length, micro_batch_size, hidden_size)``) and
    what one TP all-reduce reduces."""
    return b * model.seq_length * model.hidden_size * e


def pipeline_buffer_bytes(model: ModelSpec, b: int, e: int, p: int) -> float:
    """Send and receive buffers of one boundary activation (:func:`boundary_activation_bytes`)
    that a pipeline stage keeps allocated (Megatron-LM p2p_communication); none when p = 1."""
    return 2 * boundary_activation_bytes(model, b, e) if p > 1 else 0.0
