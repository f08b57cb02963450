"""Pydantic schema of GPU, node and cluster profiles (docs/design.md section 2).

Every model forbids unknown keys, so a typo in a profile is an error, not a silently
ignored setting. Units are in the key names: ``_GBps`` is 1e9 bytes/s, ``_Gbps`` is
1e9 bits/s, ``_GiB`` is 2**30 bytes, ``_us`` is microseconds (the multipliers: hwprofiles.units).
"""

from __future__ import annotations

import math
from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hwprofiles.units import GB, US, GiB  # GiB: also imported from here by older code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GemmPoint(_Strict):
    """One measured GEMM: C[m,n] = A[m,k] @ B[k,n] in ``dtype`` at ``tflops`` achieved."""

    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    tflops: float = Field(gt=0)
    dtype: str = "fp16"


class GemmModel(_Strict):
    """Shape-dependent GEMM efficiency (fraction of the dtype's peak).

    Curve (used when no measured table is present):
        eff(m, n, k) = max_efficiency * prod_x (x / (x + half_dim_x)),  x in {m, n, k}
    a saturating curve: a dimension equal to its ``half_dim`` halves throughput, a large
    one costs nothing. This is the shape of cuBLAS throughput-vs-size plots (e.g. NVIDIA's
    "Matrix Multiplication Background" guide); the constants come from the profile's source.
    When ``table`` holds measurements (from ``autoplan calibrate``), the simulator
    interpolates them instead (see ``simulator.cost.ops.gemm_efficiency``).
    """

    max_efficiency: float = Field(gt=0, le=1)
    half_dim_m: float = Field(ge=0, default=64)
    half_dim_n: float = Field(ge=0, default=64)
    half_dim_k: float = Field(ge=0, default=64)
    table: list[GemmPoint] = Field(default_factory=list)


class EagerHost(_Strict):
    """Host time of PyTorch eager training per pass of a block, at negligible arithmetic
    (``autoplan calibrate``, ``hwprofiles.calibrate.eager``): Python module calls, the
    dispatcher, autograd bookkeeping and, under tensor parallelism, DTensor's sharding
    propagation and redistribution. The simulator charges a pass
        synchronous (a CPU rank): sum of its ops' work + host time
        asynchronous (a GPU):    max(sum of its ops' work, host time)
    instead of ``kernel_launch_us`` per op. ``tp_layer_*``: the layer under Megatron-style
    DTensor tensor parallelism, collectives excluded (the simulator prices them on the link).
    ``optimizer_tensor_us``: AdamW step, global gradient norm and clipping, per parameter tensor;
    ``optimizer_param_ns``: the same step per parameter on large tensors (its arithmetic and
    memory passes, beyond the per-tensor host time); without it the simulator streams the
    optimizer's bytes at the elementwise bandwidth. ``tp_optimizer_tensor_us``: the step per
    tensor of the tensor-parallel layer's parameters (DTensor dispatch on every op)."""

    layer_forward_us: float = Field(ge=0)
    layer_backward_us: float = Field(ge=0)
    tp_layer_forward_us: float | None = Field(default=None, ge=0)
    tp_layer_backward_us: float | None = Field(default=None, ge=0)
    embedding_forward_us: float = Field(ge=0)
    embedding_backward_us: float = Field(ge=0)
    head_forward_us: float = Field(ge=0)
    head_backward_us: float = Field(ge=0)
    optimizer_tensor_us: float = Field(ge=0)
    optimizer_param_ns: float | None = Field(default=None, ge=0)
    tp_optimizer_tensor_us: float | None = Field(default=None, ge=0)

    def optimizer_us(self, tensor_parallel: bool) -> float:
        """Optimizer host time per parameter tensor; with TP the DTensor figure when measured."""
        if tensor_parallel and self.tp_optimizer_tensor_us is not None:
            return self.tp_optimizer_tensor_us
        return self.optimizer_tensor_us

    def layer_us(self, tensor_parallel: bool) -> tuple[float, float]:
        """(forward, backward) host time of a layer; with TP, the TP figures when measured."""
        if tensor_parallel and self.tp_layer_forward_us is not None and self.tp_layer_backward_us is not None:
            return self.tp_layer_forward_us, self.tp_layer_backward_us
        return self.layer_forward_us, self.layer_backward_us


#: elementwise op kinds a profile may give a measured bandwidth for (``elementwise_GBps``)
ELEMENTWISE_KINDS = ("add", "scale", "gelu", "dropout", "layer_norm", "softmax")


class GpuProfile(_Strict):
    """One accelerator: dense peak throughput per dtype, memory, and kernel efficiency."""

    name: str
    peak_tflops: dict[str, float]
    memory_GiB: float = Field(gt=0)
    memory_bandwidth_GBps: float = Field(gt=0)
    memory_efficiency: float = Field(gt=0, le=1, description="achieved / peak HBM bandwidth of elementwise kernels")
    gemm: GemmModel
    kernel_launch_us: float = Field(ge=0, default=5.0)
    memory_reserved_GiB: float = Field(ge=0, default=1.0, description="CUDA context, NCCL and library workspaces")
    allocator_fragmentation: float = Field(
        ge=0, lt=1, default=0.05, description="fraction of capacity lost to the caching allocator"
    )
    default_dtype: str = "fp16"
    elementwise_GBps: dict[str, float] = Field(
        default_factory=dict,
        description="achieved bandwidth (bytes read+written / time) per elementwise op kind; "
        "ops without an entry run at memory_bandwidth_GBps * memory_efficiency",
    )
    eager: EagerHost | None = None
    measured: dict[str, str] | None = None

    @field_validator("elementwise_GBps")
    @classmethod
    def _known_kinds(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if k not in ELEMENTWISE_KINDS:
                raise ValueError(f"unknown elementwise op kind {k!r} (known: {', '.join(ELEMENTWISE_KINDS)})")
            if not (x > 0 and math.isfinite(x)):
                raise ValueError(f"bandwidth of {k!r} must be a positive number, got {x!r}")
        return v

    @field_validator("peak_tflops")
    @classmethod
    def _positive_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("needs at least one dtype")
        for k, x in v.items():
            if not (isinstance(x, (int, float)) and x > 0 and math.isfinite(x)):
                raise ValueError(f"peak for {k!r} must be a positive number, got {x!r}")
        return v

    @model_validator(mode="after")
    def _default_dtype_known(self) -> GpuProfile:
        if self.default_dtype not in self.peak_tflops:
            raise ValueError(f"default_dtype {self.default_dtype!r} has no entry in peak_tflops")
        return self

    def peak_flops(self, dtype: str | None = None) -> float:
        return self.peak_tflops[dtype or self.default_dtype] * 1e12

    @property
    def usable_memory_bytes(self) -> float:
        """Capacity left for tensors: total minus runtime reserve minus allocator fragmentation."""
        return (self.memory_GiB * (1.0 - self.allocator_fragmentation) - self.memory_reserved_GiB) * GiB


class Link(_Strict):
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


class CollectiveFit(_Strict):
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


class Nvme(_Strict):
    count: int = Field(ge=1)
    bandwidth_GBps: float = Field(gt=0, description="per drive, sequential")


def _measured_at(table: dict[int, float], ranks: int) -> float | None:
    """The entry of a per-rank-count table measured with the most ranks up to ``ranks``; None
    when every entry was measured with more."""
    below = [k for k in table if k <= ranks]
    return table[max(below)] if below else None


class NodeProfile(_Strict):
    """A server: GPUs, the fabric between them, PCIe, NICs, host memory and NVMe."""

    name: str
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
    nvme: Nvme | None = None
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

    @field_validator("busy_latency_us")
    @classmethod
    def _busy_latency_keys(cls, v: dict[int, float] | None) -> dict[int, float] | None:
        if v and (any(k < 1 for k in v) or any(not (x >= 0 and math.isfinite(x)) for x in v.values())):
            raise ValueError(f"busy_latency_us maps numbers of ranks (>= 1) to microseconds >= 0, got {v!r}")
        return v

    def busy_latency_s(self, ranks: int) -> float:
        """Extra latency of a message sent inside a pass while ``ranks`` ranks of this node run:
        the entry measured with the most ranks up to ``ranks``; 0 below every measured count
        (fewer ranks than the calibration had keep cores free) or when not measured."""
        us = _measured_at(self.busy_latency_us or {}, ranks)
        return us * US if us is not None else 0.0

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


class Network(_Strict):
    topology: Literal["fat-tree", "rail-optimized", "single-switch"] = "fat-tree"
    oversubscription: float = Field(ge=1.0, default=1.0)
    switch_radix: int = Field(ge=2, default=40, description="ports per leaf switch (HDR QM8700: 40)")
    switch_latency_us: float = Field(ge=0, default=0.13)


class ClusterSpec(_Strict):
    """A cluster: ``nodes`` identical nodes joined by ``network``. ``node`` is resolved."""

    name: str
    nodes: int = Field(ge=1)
    node: NodeProfile
    network: Network = Network()
    measured: date | None = None

    @field_validator("node")
    @classmethod
    def _nics_between_nodes(cls, node: NodeProfile, info: ValidationInfo) -> NodeProfile:
        nodes = info.data.get("nodes", 1)
        if nodes > 1 and (node.nics_per_node == 0 or node.nic is None):
            raise ValueError(
                f"node '{node.name}' has no NICs (nics_per_node: 0), so a cluster of {nodes} such nodes cannot communicate"
            )
        return node

    @property
    def gpu(self) -> GpuProfile:
        return self.node.gpu  # type: ignore[return-value]  # the loaders resolve names to profiles

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.node.gpus_per_node

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node
