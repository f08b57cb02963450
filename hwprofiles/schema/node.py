"""A node profile: its GPUs, the links between them (NVLink/NVSwitch, PCIe, NICs), per-collective fits,
host memory and NVMe."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from hwprofiles.names import Name
from hwprofiles.schema.base import Strict
from hwprofiles.schema.gpu import GpuProfile
from hwprofiles.units import GB, US


class Link(Strict):
    """A link class: bandwidth per direction and one-way latency; ``efficiency`` is the
    fraction of the nominal bandwidth that bulk collective traffic achieves."""

    kind: Literal["nvswitch", "nvlink", "pcie", "loopback", "infiniband", "roce", "ethernet"] = "nvswitch"
    bandwidth_GBps: float | None = Field(default=None, gt=0)
    bandwidth_Gbps: float | None = Field(default=None, gt=0)
    latency_us: float = Field(ge=0, default=0.0)
    efficiency: float = Field(gt=0, le=1, default=1.0)

    @model_validator(mode="after")
    def _one_bandwidth(self) -> Link:
        if (self.bandwidth_GBps is None) == (self.bandwidth_Gbps is None):
            raise ValueError("give exactly one of bandwidth_GBps or bandwidth_Gbps")
        return self

    @property
    def bytes_per_s(self) -> float:
        """Achievable bytes/s per direction: nominal * efficiency."""
        if self.bandwidth_GBps is not None:
            nominal = self.bandwidth_GBps * GB
        else:
            assert self.bandwidth_Gbps is not None  # the validator requires one of the two
            nominal = self.bandwidth_Gbps * GB / 8
        return nominal * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


#: collectives a node may carry its own alpha-beta fit for (``NodeProfile.collectives``)
CollectiveName = Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv"]


class CollectiveFit(Strict):
    """One collective's own ring alpha-beta fit inside a node: bus bandwidth and per-step latency
    (hwprofiles.calibrate.fit.fit_link over that collective's samples only)."""

    bandwidth_GBps: float = Field(gt=0)
    latency_us: float = Field(ge=0)

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_GBps * GB

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class Nvme(Strict):
    count: int = Field(ge=1)
    bandwidth_GBps: float = Field(gt=0, description="per drive, sequential")


def _measured_at(table: dict[int, float], ranks: int) -> float | None:
    """The entry of a per-rank-count table measured with the most ranks up to ``ranks``; None
    when every entry was measured with more."""
    below = [k for k in table if k <= ranks]
    return table[max(below)] if below else None


class NodeProfile(Strict):
    """A server: GPUs, the fabric between them, PCIe, NICs, host memory and NVMe."""

    name: Name  # hwprofiles.names: letters, digits, . _ + - /
    gpu: str | GpuProfile
    gpus_per_node: int = Field(ge=1)
    intra_node: Link
    pcie: Link
    nics_per_node: int = Field(ge=0)
    nic: Link | None = None
    host_memory_GiB: float = Field(gt=0)
    cpu_adam_GBps: float = Field(
        gt=0, default=20.0, description="host optimizer-step throughput over fp32 optimizer state"
    )
    host_sum_GBps: float = Field(
        gt=0,
        default=39.4,
        description="host fp32 sum a += b, bytes of one operand per second on the host's threads (an FSDP2-"
        "offloading rank sums each microbatch's gradients there); default: one rank's 16 threads on a "
        "16-core VM host of an H200, 2026-11-27 (benchmarks/data/h200-2026-11-27/offload.json)",
    )
    host_norm_GBps: float = Field(
        gt=0,
        default=10.6,
        description="host gradient norm (torch.nn.utils.get_total_norm over fp32 tensors), bytes read per "
        "second; default: measured as host_sum_GBps",
    )
    nvme: Nvme | None = None
    gpu_hour_price: float | None = Field(default=None, gt=0, description="price of one GPU-hour (any currency)")
    backend: Literal["nccl", "gloo"] = "nccl"
    compute_slots: float | dict[int, float] | None = Field(
        default=None,
        description="ranks' worth of compute the node delivers at once: a number, or per number of busy ranks "
        "(a localhost-cpu node measured by calibrate: cores times their parallel efficiency, which "
        "drops when more ranks than cores evict each other's caches); None: one per GPU",
    )

    collectives: dict[CollectiveName, CollectiveFit] | None = Field(
        default=None,
        description="per-collective fits inside the node, replacing intra_node's bandwidth and latency for "
        "that collective (gloo runs each collective with its own code and speed: on a 4-rank host "
        "its reduce-scatter moves bytes at a third of its send/recv's rate); written by calibrate",
    )

    busy_latency_us: dict[int, float] | None = Field(
        default=None,
        description="per number of ranks on the node: extra one-way latency of a message while the other ranks "
        "compute (CPU ranks that outnumber the cores: a woken rank waits for a core); written by calibrate",
    )

    sync_wait_us: dict[int, float] | None = Field(
        default=None,
        description="per number of busy ranks: extra time of a blocking collective or message issued after "
        "computing (the ranks arrive apart and a blocked rank is woken; CPU ranks with a core each); "
        "written by calibrate",
    )

    sync_bus_us_per_MB: dict[int, float] | None = Field(
        default=None,
        description="per number of busy ranks: extra microseconds per MB (1e6 bytes) of a blocking collective's "
        "bus traffic when it is issued after computing, beyond its back-to-back fit and sync_wait_us (on a "
        "shared CPU host a large gloo all-reduce after compute runs slower than back to back); written by calibrate",
    )

    @field_validator("busy_latency_us", "sync_wait_us", "sync_bus_us_per_MB")
    @classmethod
    def _per_rank_microseconds(cls, v: dict[int, float] | None, info: ValidationInfo) -> dict[int, float] | None:
        if v and (any(k < 1 for k in v) or any(not (x >= 0 and math.isfinite(x)) for x in v.values())):
            raise ValueError(f"{info.field_name} maps numbers of ranks (>= 1) to microseconds >= 0, got {v!r}")
        return v

    def busy_latency_s(self, ranks: int) -> float:
        """Extra latency of a message sent inside a pass while ``ranks`` ranks of this node run:
        the entry measured with the most ranks up to ``ranks``; 0 below every measured count
        (fewer ranks than the calibration had keep cores free) or when not measured."""
        us = _measured_at(self.busy_latency_us or {}, ranks)
        return us * US if us is not None else 0.0

    def sync_wait_s(self, ranks: int) -> float:
        """Extra time of each blocking collective or message of ``ranks`` busy ranks of this node
        (sync_wait_us): the entry measured with the most ranks up to ``ranks``, so more ranks than
        cores (which calibrate does not measure) take the cores' entry, their time-slicing being
        what busy_latency_us and compute_slots add; 0 with one rank, below every measured count,
        or when not measured."""
        us = _measured_at(self.sync_wait_us or {}, ranks) if ranks > 1 else None
        return us * US if us is not None else 0.0

    def sync_bus_s_per_byte(self, ranks: int) -> float:
        """Extra seconds per bus byte of each blocking collective of ``ranks`` busy ranks of this
        node issued after computing (sync_bus_us_per_MB), looked up as :meth:`sync_wait_s`."""
        us = _measured_at(self.sync_bus_us_per_MB or {}, ranks) if ranks > 1 else None
        return us * US / 1e6 if us is not None else 0.0

    @field_validator("compute_slots")
    @classmethod
    def _slots_at_least_one(cls, v: float | dict[int, float] | None) -> float | dict[int, float] | None:
        values = v.values() if isinstance(v, dict) else [] if v is None else [v]
        if any(not (x >= 1 and math.isfinite(x)) for x in values):
            raise ValueError(f"compute slots must be numbers >= 1, got {v!r}")
        if isinstance(v, dict) and any(k < 1 for k in v):
            raise ValueError(f"compute_slots keys are numbers of ranks (>= 1), got {sorted(v)}")
        return v

    def slots_for(self, ranks: int) -> float | None:
        """Compute slots when ``ranks`` ranks of this node compute at once: the measured entry
        for that many ranks, else that of the nearest smaller count measured (at most ``ranks``),
        else ``ranks`` itself (fewer ranks than any measured count share nothing); None: no limit."""
        slots = self.compute_slots
        if slots is None or not isinstance(slots, dict):
            return slots
        got = _measured_at(slots, ranks)
        return min(float(ranks), got) if got is not None else float(ranks)

    def intra_figures(self, collective: CollectiveName) -> tuple[float, float]:
        """(bus bytes/s, per-step latency in s) of ``collective`` inside this node: its own fit
        when the node has one, else the intra-node link's."""
        fit = self.collectives.get(collective) if self.collectives else None
        if fit is not None:
            return fit.bytes_per_s, fit.latency_s
        return self.intra_node.bytes_per_s, self.intra_node.latency_s

    @model_validator(mode="after")
    def _nic_present(self) -> NodeProfile:
        if self.nics_per_node > 0 and self.nic is None:
            raise ValueError("nics_per_node > 0 needs a 'nic' mapping")
        return self
