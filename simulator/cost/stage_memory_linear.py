"""The linear form of the stage memory model (simulator.cost.stage_memory) for the CP-SAT
partitioner (autoplan.partition): the bytes of one pipeline device as a linear function of its
per-chunk layer counts n_c, fully recomputed layers f_c and selectively recomputed layers s_c, one
expression per reachable occupancy vector k:

    mem = fixed + a_none * [any f_c > 0]
          + sum_c [ (states_layer + k_c a_none + w) n_c + k_c (a_full - a_none) f_c + k_c (a_sel - a_none) s_c ]
          + gpipe * sum_c [ (a_none - a_full) f_c + (a_none - a_sel) s_c ]

where ``gpipe`` is 1 for GPipe with m > 1 (its last microbatch is not recomputed, so it keeps its
layers' full activations) and ``w`` the inputs ZB-H1's deferred weight gradients keep per layer (0
for the other schedules). The gradient buckets depend on the stage's parameter count,
min(2 * bucket, psi * grad bytes); the linear form takes their cap, so it is the exact peak once a
stage's gradients exceed two buckets and an upper bound below that (tests/test_stage_memory.py).
It prices the default runtime's (Megatron-style) buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwprofiles.schema import ClusterSpec
from simulator.cost import memory, params
from simulator.cost.ops import dtype_bytes
from simulator.cost.precision import fp8_layer_bytes, fp8_shard_bytes
from simulator.cost.stage_memory import layer_activations, pending_weight_inputs, stage_buffers
from simulator.cost.workload import padded_vocab_size
from simulator.plan import Plan
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class DeviceMemoryModel:
    """The linear form of :func:`stage_memory` for one device (module docstring)."""

    fixed: float  # bytes that do not scale with the device's layers
    layer_states: float  # model states of one layer
    a_full: float
    a_sel: float
    a_none: float
    occupancy: tuple[tuple[int, ...], ...]  # reachable per-chunk in-flight counts (memory.chunk_occupancy)
    gpipe_last_kept: bool  # GPipe, m > 1: the last microbatch keeps full activations
    pending_w: float = 0.0  # ZB-H1: bytes per layer of the deferred weight gradients' inputs

    @staticmethod
    def of(
        model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, stage: int, first: bool, last: bool
    ) -> DeviceMemoryModel:
        e = dtype_bytes(cluster.gpu)
        pb, gb, k = memory.state_bytes_per_param(e)
        a_full, a_sel, a_none = layer_activations(model, plan.mb, plan.t, bool(plan.sp), e, plan.prec)
        psi_layer = params.layer_params_per_rank(model, plan.t)
        layer_states = memory.model_state_bytes(
            psi_layer,
            plan.shard_group,
            plan.zero,
            plan.offload,
            pb,
            gb,
            k,
            psi_layer + params.layer_sharded_extra(model, plan.t),
        ).total
        if plan.zero != 3:  # fp8 weight copies per layer (ZeRO-3: the working set's, in fixed)
            layer_states += fp8_layer_bytes(plan, psi_layer, e)
        layer_states += fp8_shard_bytes(
            plan.fp8ag, plan.zero, psi_layer, e, plan.shard_group
        )  # fp8 parameters' ZeRO-3 shards
        psi = params.stage_params_per_rank(model, plan.t, plan.p, 0, first, last, padded_vocab_size(model, plan.t))
        fixed = memory.model_state_bytes(psi, plan.shard_group, plan.zero, plan.offload, pb, gb, k).total
        fixed += stage_buffers(model, cluster, plan, m, stage, last, None)
        if plan.zero == 3:
            fixed += memory.ZERO3_LAYERS_HELD * fp8_layer_bytes(plan, psi_layer, e)
        if first:
            inflight = memory.end_chunk_in_flight(plan.schedule, stage, plan.p, m, plan.v, 0)
            fixed += inflight * memory.embedding_activation_bytes(
                plan.mb, model.seq_length, model.hidden_size, plan.t, bool(plan.sp)
            )
        occupancy = memory.chunk_occupancy(plan.schedule, stage, plan.p, m, plan.v)
        return DeviceMemoryModel(
            fixed,
            layer_states,
            a_full,
            a_sel,
            a_none,
            occupancy,
            plan.schedule == "gpipe" and m > 1,
            pending_weight_inputs(model, cluster, plan, m, stage),
        )

    def coefficients(self, vec: tuple[int, ...]) -> list[tuple[float, float, float]]:
        """Per chunk of the device, the bytes per unit of (n_c, f_c, s_c) under occupancy ``vec``."""
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
        return self.fixed + (self.a_none if any(f) else 0.0) + worst
