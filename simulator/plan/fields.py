"""The plan itself: its kinds (enums and the matching Literals), the :class:`Plan` record and
what follows from it alone (docs/design.md section 2, "Plan string")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, get_args

from simulator.numeric import maximum, where


class Recompute(StrEnum):
    """Activation recomputation of a layer (Korthikanti et al. 2022)."""

    NONE = "none"
    SELECTIVE = "selective"  # the attention core only
    FULL = "full"  # the whole layer from its input


class Schedule(StrEnum):
    """Pipeline schedules (simulator.cost.schedules)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZB_H1 = "zbh1"  # zero bubble (Qi et al. 2024): backward split into input and weight gradients
    ZB_V = "zbv"  # zero bubble with two chunks per rank in a V (ibid., section 6): v = 2


class Precision(StrEnum):
    """Precision of the transformer layers' linear GEMMs (simulator.cost.precision)."""

    BF16 = "bf16"  # the GPU profile's 16-bit training dtype everywhere (bf16; fp16 on V100)
    FP8 = "fp8"  # Transformer Engine / torchao float8: fp8 linear GEMMs, the rest in bf16


class Offload(StrEnum):
    """Where ZeRO-Offload / ZeRO-Infinity keep the optimizer state (and ZeRO-3 parameters)."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


RecomputeName = Literal["none", "selective", "full"]
ScheduleName = Literal["gpipe", "1f1b", "interleaved", "zbh1", "zbv"]
OffloadName = Literal["none", "cpu", "nvme"]
PrecisionName = Literal["bf16", "fp8"]
ZeroStage = Literal[0, 1, 2, 3]

#: the schedules whose backward runs as an input-gradient pass and a later weight-gradient pass
ZERO_BUBBLE_SCHEDULES = frozenset((Schedule.ZB_H1, Schedule.ZB_V))
CKPT_MODES: tuple[RecomputeName, ...] = get_args(RecomputeName)  # the enums' values, in order (tested)
SCHEDULES: tuple[ScheduleName, ...] = get_args(ScheduleName)
OFFLOADS: tuple[OffloadName, ...] = get_args(OffloadName)
PRECISIONS: tuple[PrecisionName, ...] = get_args(PrecisionName)
ZERO_STAGES: tuple[ZeroStage, ...] = get_args(ZeroStage)
PLAN_INT_KEYS = ("t", "p", "d", "mb", "zero", "v", "sp", "hsdp", "cp", "ep", "fp8ag")
PLAN_STR_KEYS = {"ckpt": CKPT_MODES, "schedule": SCHEDULES, "offload": OFFLOADS, "prec": PRECISIONS}
PLAN_KEYS = PLAN_INT_KEYS + tuple(PLAN_STR_KEYS) + ("layers", "recompute")


@dataclass(frozen=True)
class Plan:
    """One parallelization plan (docs/design.md section 2, "Plan string").

    ``layers``: transformer layers per pipeline chunk, in model order (p*v entries), or None
    for the uniform split. ``recompute``: per pipeline chunk, (layers fully recomputed,
    layers selectively recomputed); the rest run without recomputation. None means every
    layer uses ``ckpt``. Both are chosen by the planner's CP-SAT model. ``hsdp``: hybrid
    sharding (FSDP ``HYBRID_SHARD``, FSDP2 on a (replicate, shard) mesh): the ZeRO-2/3 states
    are sharded over groups of ``hsdp`` consecutive data-parallel ranks and replicated across
    the d / hsdp groups; 0 shards over all d. ``prec``: "fp8" runs the transformer layers'
    linear GEMMs in fp8 (Transformer Engine's hybrid recipe, torchao float8), the rest in the
    GPU's 16-bit dtype; it needs a GPU profile with an fp8 peak and fp8 GEMM efficiency.
    ``cp``: context parallelism (Megatron-LM ``--context-parallel-size``): each sequence is split
    over cp ranks, which exchange keys and values around a ring in every attention
    (simulator.cost.context). Ranks are ordered tensor innermost, then context, data, pipeline
    (Megatron-LM's order), so t*cp*p*d GPUs; ``d`` counts the data-parallel replicas (the batch
    is split d ways) and the parameters' gradients are reduced, and ZeRO states sharded, over the
    d*cp ranks that hold the same weights (:attr:`grad_group`). ``ep``: expert parallelism of a
    mixture of experts (Megatron-LM ``--expert-model-parallel-size``): its experts split over ep
    of those d*cp ranks, which exchange the routed tokens with all-to-alls (simulator.cost.experts).
    ``fp8ag``: with prec=fp8 and ZeRO >= 1, the layers' GEMM weights are kept in fp8 and
    all-gathered in fp8 (Megatron-LM ``--fp8-param-gather``; simulator.cost.precision).
    """

    t: int = 1
    p: int = 1
    d: int = 1
    mb: int = 1
    zero: int = 0  # ZeroStage once validated (plan_errors)
    ckpt: RecomputeName = "none"
    v: int = 1
    schedule: ScheduleName = "1f1b"
    offload: OffloadName = "none"
    sp: int = 0
    layers: tuple[int, ...] | None = None
    recompute: tuple[tuple[int, int], ...] | None = None
    hsdp: int = 0
    prec: PrecisionName = "bf16"
    cp: int = 1
    ep: int = 1
    fp8ag: int = 0

    @property
    def grad_group(self) -> int:
        """Ranks holding the same parameters, over which gradients are reduced: d*cp."""
        return self.d * self.cp

    @property
    def zero_without_effect(self) -> bool:
        """A ZeRO stage above 0 with nothing to act on: one rank holds the weights (grad_group 1),
        so there is nothing to shard or reduce, and nothing is offloaded (ZeRO-Offload moves the
        states off the GPU even on one rank). Such a plan runs as ZeRO 0 does, as fast, and holds
        as much memory or more (ZeRO-1's and ZeRO-3's working buffers): the search leaves it out."""
        return self.zero > 0 and self.grad_group == 1 and self.offload == "none"

    @property
    def shard_group(self) -> int:
        """Ranks that share one copy of the sharded states (:func:`shard_group_of`)."""
        return shard_group_of(self.hsdp, self.grad_group)

    @property
    def replicas(self) -> int:
        """Copies of the sharded states (:func:`replicas_of`)."""
        return replicas_of(self.grad_group, self.shard_group)

    @property
    def split_backward(self) -> bool:
        """Whether the backward runs as an input-gradient pass and a later weight-gradient pass
        (the zero-bubble schedules)."""
        return self.schedule in ZERO_BUBBLE_SCHEDULES

    @property
    def model_parallel(self) -> int:
        return self.t * self.p

    @property
    def gpus(self) -> int:
        return self.t * self.cp * self.p * self.d

    def replace(self, **kw: Any) -> Plan:
        return dataclasses.replace(self, **kw)

    def to_string(self) -> str:
        s = (
            f"t={self.t},p={self.p},d={self.d},mb={self.mb},zero={self.zero},ckpt={self.ckpt},"
            f"v={self.v},schedule={self.schedule},offload={self.offload},sp={self.sp}"
        )
        if self.layers is not None:
            s += ",layers=" + "/".join(map(str, self.layers))
        if self.recompute is not None:
            s += ",recompute=" + "/".join(f"{f}:{sel}" for f, sel in self.recompute)
        if self.hsdp:
            s += f",hsdp={self.hsdp}"
        if self.prec != Precision.BF16:
            s += f",prec={self.prec}"
        if self.cp > 1:
            s += f",cp={self.cp}"
        if self.ep > 1:
            s += f",ep={self.ep}"
        if self.fp8ag:
            s += f",fp8ag={self.fp8ag}"
        return s

    def to_dict(self, num_microbatches: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "t": self.t,
            "p": self.p,
            "d": self.d,
            "mb": self.mb,
        }
        if num_microbatches is not None:
            out["num_microbatches"] = num_microbatches
        out.update(
            {
                "zero": self.zero,
                "ckpt": self.ckpt,
                "v": self.v,
                "schedule": self.schedule,
                "offload": self.offload,
                "sp": self.sp,
            }
        )
        if self.layers is not None:
            out["layers"] = list(self.layers)
        if self.recompute is not None:
            out["recompute"] = [list(x) for x in self.recompute]
        if self.hsdp:
            out["hsdp"] = self.hsdp
        if self.prec != Precision.BF16:
            out["prec"] = self.prec
        if self.cp > 1:
            out["cp"] = self.cp
        if self.ep > 1:
            out["ep"] = self.ep
        if self.fp8ag:
            out["fp8ag"] = self.fp8ag
        return out

    def chunk_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers in each of the p*v pipeline chunks (model order): explicit or uniform."""
        if self.layers is not None:
            return self.layers
        n = self.p * self.v
        base, extra = divmod(num_layers, n)
        return tuple(base + (1 if i < extra else 0) for i in range(n))

    def chunk_recompute(self, num_layers: int) -> tuple[tuple[int, int], ...]:
        """(full, selective) recomputed layers per chunk, explicit or from ``ckpt``."""
        if self.recompute is not None:
            return self.recompute
        return tuple(
            (n, 0) if self.ckpt == "full" else (0, n) if self.ckpt == "selective" else (0, 0)
            for n in self.chunk_layers(num_layers)
        )


def num_microbatches(plan: Plan, global_batch: int) -> int:
    """:func:`microbatches` of ``plan``."""
    return microbatches(global_batch, plan.d, plan.mb)


def microbatches(global_batch: int, d: Any, mb: Any) -> Any:
    """Microbatches per pipeline per iteration: B / (d * mb). Numbers or arrays alike."""
    return global_batch // (d * mb)


def shard_group_of(hsdp: Any, grad_group: Any) -> Any:
    """Ranks that share one copy of the sharded states: hsdp (hybrid sharding), or all of the
    ``grad_group`` ranks holding the same weights (d * cp). Numbers or arrays alike."""
    return where(hsdp > 0, hsdp, grad_group)


def replicas_of(grad_group: Any, shard_group: Any) -> Any:
    """Copies of the sharded states (hybrid sharding's replicate groups): grad_group / shard_group,
    at least 1. Numbers or arrays alike."""
    return maximum(1, grad_group // shard_group)
