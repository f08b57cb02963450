"""The linear form of the stage memory model (simulator.cost.stage_memory) for the CP-SAT
partitioner (autoplan.partition): the bytes of one pipeline device, as the job's runtime holds
them, as a linear function of its per-chunk layer counts n_c, fully recomputed layers f_c and
selectively recomputed layers s_c, one expression per reachable occupancy vector k and phase:

    mem = fixed + sum_c [ (states_layer + k_c a_none + w) n_c + k_c (a_full - a_none) f_c + k_c (a_sel - a_none) s_c ]
          + gpipe * sum_c [ (a_none - a_full) f_c + (a_none - a_sel) s_c ]
          + phase

where ``gpipe`` is 1 for GPipe with m > 1 (its last microbatch is not recomputed, so it keeps its
layers' full activations), ``w`` the inputs ZB-H1's deferred weight gradients keep per layer (0
for the other schedules) and ``phase`` each of the three terms of the largest phase's transient
(simulator.cost.phase_memory.phase_transient), linear in the stage's parameters P = P_0 + psi * sum_c n_c:

    forward's end:   c P + loss_forward
    loss backward:   c P' + loss_backward
    recompute:       c P' + a_none [any f_c > 0]

with c the runtime's compute-dtype weight copies per parameter and P' the copies the backward
still holds (P without a pipeline's fully recomputed layers' parameters, P with one). A phase
no larger than another for every (n, f, s) is left out: for a runtime without weight copies or a
loss transient (Megatron-style), only the recompute phase remains.

The gradient buckets depend on the stage's parameter count, min(2 * bucket, psi * grad bytes);
the linear form takes their cap, so it is the exact peak once a stage's gradients exceed two
buckets and an upper bound below that (tests/test_stage_memory.py). A runtime holding a copy of
every gradient (PyTorch DDP, Runtime.dp_buckets "all") holds psi * grad bytes: linear, exact. A
rank whose gradients exist only after its one microbatch's activations are freed
(simulator.cost.phase_memory.gradients_late: p = 1, m = 1) peaks lower than the form, which adds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from simulator.cost import memory, params, state_bytes
from simulator.cost.cache import IdentityCache
from simulator.cost.fsdp2_sync import plan_deferred_sync, whole_grad_bytes, zero2_unsharded_bytes, zero3_gathered_bytes
from simulator.cost.ops import dtype_bytes
from simulator.cost.phase_memory import weight_copies_held, weight_copies_saved
from simulator.cost.precision import fp8_layer_bytes, fp8_shard_bytes
from simulator.cost.stage_memory import flight_buffers, layer_activations, pending_weight_inputs, sharding_buffers
from simulator.cost.workload import padded_vocab_size
from simulator.job import Job


class Phase(NamedTuple):
    """One phase's transient bytes: ``constant`` + ``per_layer`` * sum n_c + ``per_full`` * sum f_c
    + ``any_full`` * [any f_c > 0]."""

    constant: float
    per_layer: float
    per_full: float
    any_full: float

    def covers(self, other: Phase) -> bool:
        """Whether this phase holds at least ``other``'s bytes for every n >= f >= 0: the difference
        dc + dl * (n - f) + (dl + df) * f + da * [f > 0] is then a sum of non-negative terms."""
        return (
            self.constant >= other.constant
            and self.per_layer >= other.per_layer
            and self.per_layer + self.per_full >= other.per_layer + other.per_full
            and self.any_full >= other.any_full
        )


@dataclass(frozen=True)
class DeviceMemoryModel:
    """The linear form of :func:`stage_memory` for one device (module docstring)."""

    fixed: float  # bytes that do not scale with the device's layers
    layer_states: float  # model states of one layer (with DDP's copy of its gradients)
    a_full: float
    a_sel: float
    a_none: float
    occupancy: tuple[tuple[int, ...], ...]  # reachable per-chunk in-flight counts (memory.chunk_occupancy)
    gpipe_last_kept: bool  # GPipe, m > 1: the last microbatch keeps full activations
    phases: tuple[Phase, ...]  # the transients that can be the largest (module docstring)
    pending_w: float = 0.0  # ZB-H1: bytes per layer of the deferred weight gradients' inputs

    @staticmethod
    def of(job: Job, stage: int, first: bool, last: bool) -> DeviceMemoryModel:
        """Device ``stage`` of ``job`` (its rank view: the caller's), as the job's runtime holds it."""
        model, plan, m = job.model, job.plan, job.m
        terms = _device_terms(job, first, last)
        loss = job.runtime.loss(plan.t)
        fixed = terms.held + (flight_buffers(model, job.cluster, plan, m, stage, last, loss) if last else terms.flight)
        if plan.zero == 3:
            fixed += terms.zero3_copies
        if first:
            inflight = memory.end_chunk_in_flight(plan.schedule, stage, plan.p, m, plan.v, 0)
            fixed += inflight * memory.embedding_activation_bytes(
                plan.mb, model.seq_length, model.hidden_size, plan.t, bool(plan.sp)
            )
        occupancy = memory.chunk_occupancy(plan.schedule, stage, plan.p, m, plan.v)
        return DeviceMemoryModel(
            fixed,
            terms.layer_states,
            terms.a_full,
            terms.a_sel,
            terms.a_none,
            occupancy,
            plan.schedule == "gpipe" and m > 1,
            terms.phases,
            pending_weight_inputs(model, job.cluster, plan, m, stage),
        )

    def coefficients(self, vec: tuple[int, ...]) -> list[tuple[float, float, float]]:
        """Per chunk of the device, the bytes per unit of (n_c, f_c, s_c) under occupancy ``vec``
        (the lasting terms: each phase adds its own, :class:`Phase`)."""
        g = 1.0 if self.gpipe_last_kept else 0.0
        return [
            (
                self.layer_states + k * self.a_none + self.pending_w,
                k * (self.a_full - self.a_none) + g * (self.a_none - self.a_full),
                k * (self.a_sel - self.a_none) + g * (self.a_none - self.a_sel),
            )
            for k in vec
        ]

    def bytes(self, n: list[int], f: list[int], s: list[int]) -> float:
        """The peak for the device's chunks' (n, f, s), in local chunk order."""
        worst = max(
            sum(cn * nc + cf * fc + cs * sc for (cn, cf, cs), nc, fc, sc in zip(self.coefficients(vec), n, f, s))
            for vec in self.occupancy
        )
        transient = max(
            ph.constant + ph.per_layer * sum(n) + ph.per_full * sum(f) + (ph.any_full if any(f) else 0.0)
            for ph in self.phases
        )
        return self.fixed + worst + transient


class _DeviceTerms(NamedTuple):
    """What a device's form takes from its job and from whether it holds the embedding and the
    head, the same for every device of a pipeline that holds the same ends."""

    held: float  # its non-layer parameters' model states and the gradient buffers
    flight: float  # without the head: its pipeline buffers (stage_memory.flight_buffers, the same on every stage)
    zero3_copies: float  # ZeRO-3: the fp8 weight copies of the layers it holds gathered
    layer_states: float
    a_full: float
    a_sel: float
    a_none: float
    phases: tuple[Phase, ...]


_TERMS = IdentityCache(1024)  # per job and ends: a pipeline's devices ask for the same


def _device_terms(job: Job, first: bool, last: bool) -> _DeviceTerms:
    return _TERMS.get_or_make((job,), (first, last), lambda: _make_terms(job, first, last))


def _make_terms(job: Job, first: bool, last: bool) -> _DeviceTerms:
    model, cluster, plan, runtime = job.model, job.cluster, job.plan, job.runtime
    e = dtype_bytes(cluster.gpu)
    pb, gb, k = state_bytes.program_state_bytes(runtime.states, e, plan.zero, runtime.scatter_gather)
    a_full, a_sel, a_none = layer_activations(
        model, plan.mb, plan.t, bool(plan.sp), e, plan.prec, runtime.layer_kernels
    )
    psi_layer = params.layer_params_per_rank(model, plan.t)
    deferred = plan_deferred_sync(plan, runtime)
    whole = whole_grad_bytes(deferred, runtime, e)
    unsharded = zero2_unsharded_bytes(plan.d, plan.zero, runtime, e)
    layer_states = memory.model_state_bytes(
        psi_layer,
        plan.shard_group,
        plan.zero,
        plan.offload,
        pb,
        gb,
        k,
        psi_layer + params.layer_sharded_extra(model, plan.t),
        whole,
        unsharded,
    ).total
    if plan.zero != 3:  # fp8 weight copies per layer (ZeRO-3: the working set's, in fixed)
        layer_states += fp8_layer_bytes(plan, psi_layer, e)
    layer_states += fp8_shard_bytes(plan.fp8ag, plan.zero, psi_layer, e, plan.shard_group)  # fp8 parameters' shards
    psi = params.stage_params_per_rank(model, plan.t, plan.p, 0, first, last, padded_vocab_size(model, plan.t))
    held = memory.model_state_bytes(
        psi, plan.shard_group, plan.zero, plan.offload, pb, gb, k, None, whole, unsharded
    ).total
    bucket = memory.bucket_bytes_of(runtime, plan.d)
    if runtime.dp_buckets == "all":  # a copy of every gradient: linear in the parameters, exact
        buffers = sharding_buffers(model, plan, e, psi, bucket, True, gb, deferred)
        held += buffers
        layer_states += sharding_buffers(model, plan, e, psi + psi_layer, bucket, True, gb, deferred) - buffers
    else:  # two buckets in flight, at their cap; a deferred sync's gathered parameters per parameter
        held += sharding_buffers(model, plan, e, None, bucket, False, gb, deferred)
        if plan.zero == 3:
            held += zero3_gathered_bytes(0.0, psi, deferred, e)
            layer_states += zero3_gathered_bytes(0.0, psi_layer, deferred, e)
    zero3_copies = memory.ZERO3_LAYERS_HELD * fp8_layer_bytes(plan, psi_layer, e)
    phases = _phases(job, psi, psi_layer, last, a_none)
    flight = flight_buffers(model, cluster, plan, job.m, 0, False, runtime.loss(plan.t))
    return _DeviceTerms(held, flight, zero3_copies, layer_states, a_full, a_sel, a_none, phases)


def _phases(job: Job, psi: float, psi_layer: float, last: bool, a_none: float) -> tuple[Phase, ...]:
    """The phases of :func:`simulator.cost.phase_memory.phase_transient` as linear terms of a device
    of ``psi`` parameters besides its layers' (``psi_layer`` each), those another does not cover
    (module docstring)."""
    model, plan, runtime = job.model, job.plan, job.runtime
    e = dtype_bytes(job.cluster.gpu)
    copies = runtime.weight_copy_bytes
    loss = runtime.loss(plan.t)
    logits = memory.logits_elements(model, plan.mb, plan.t, padded_vocab_size(model, plan.t), loss)
    loss_forward, loss_backward = memory.loss_transient_bytes(logits, loss, e) if last else (0.0, 0.0)
    held, per_layer = weight_copies_held(copies, psi), weight_copies_held(copies, psi_layer)
    saved_full = weight_copies_saved(copies, 0.0, psi_layer, plan.p > 1)  # a fully recomputed layer's share
    phases = [
        Phase(held + loss_forward, per_layer, 0.0, 0.0),
        Phase(held + loss_backward, per_layer, saved_full, 0.0),
        Phase(held, per_layer, saved_full, a_none),
    ]
    return _uncovered(phases)


def _uncovered(phases: list[Phase]) -> tuple[Phase, ...]:
    """``phases`` less each one another covers (of equal ones, the first is kept)."""
    kept = []
    for i, ph in enumerate(phases):
        if not any(other.covers(ph) and (other != ph or j < i) for j, other in enumerate(phases) if j != i):
            kept.append(ph)
    return tuple(kept)
