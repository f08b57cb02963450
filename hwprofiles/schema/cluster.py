"""A cluster: identical nodes joined by a network."""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from hwprofiles.names import Name
from hwprofiles.schema.base import Strict
from hwprofiles.schema.gpu import GpuProfile
from hwprofiles.schema.node import NodeProfile


class Network(Strict):
    topology: Literal["fat-tree", "rail-optimized", "single-switch"] = "fat-tree"
    oversubscription: float = Field(ge=1.0, default=1.0)
    switch_radix: int = Field(ge=2, default=40, description="ports per leaf switch (HDR QM8700: 40)")
    switch_latency_us: float = Field(ge=0, default=0.13)
    busbw_scaling: float = Field(
        ge=0,
        default=0.094,
        description="inter-node bus bandwidth falls as (nodes / 4) ** -busbw_scaling beyond 4 nodes: NCCL ring "
        "reduce-scatter on DGX H100 drops from 360 to 260 GB/s between 4 and 128 nodes (NVIDIA/nccl#1229), "
        "ln(360/260) / ln(32) = 0.094",
    )

    def busbw_factor(self, nodes: int) -> float:
        """Fraction of the few-node bus bandwidth a collective spanning ``nodes`` nodes reaches:
        min(1, (nodes / 4) ** -busbw_scaling)."""
        return 1.0 if nodes <= 4 else (nodes / 4) ** -self.busbw_scaling


class Reliability(Strict):
    """How often a job is interrupted and what a restart costs (autoplan.sizing.failures)."""

    failures_per_gpu_hour: float = Field(
        gt=0,
        default=1.97e-5,
        description="job interruptions per GPU-hour: Llama 3 405B's pre-training saw 419 unexpected "
        "interruptions in 54 days on up to 16,384 H100 GPUs (Dubey et al. 2024, arXiv:2407.21783, section "
        "3.3.4): 419 / (54 * 24 * 16384) = 1.97e-5",
    )
    checkpoint_GBps_per_gpu: float = Field(
        gt=0,
        default=0.122,
        description="storage bandwidth per GPU for writing and reading checkpoints: Llama 3's storage "
        "sustained 2 TB/s for 16,384 GPUs (Dubey et al. 2024, section 3.3.1): 2e12 / 16384 = 122 MB/s",
    )
    detect_s: float = Field(
        ge=0,
        default=300.0,
        description="seconds until a hung or failed rank is noticed: NeMo's fault tolerance rank heartbeat "
        "timeout, 300 s by default (docs.nvidia.com/nemo-framework, Resiliency)",
    )
    relaunch_s: float = Field(
        ge=0,
        default=150.0,
        description="seconds to restart the job's processes and rebuild its communicators, the checkpoint "
        "read aside: FlashRecovery restarts 4,800 devices in 150 s (arXiv:2509.03047; an optimized "
        "system, so a lower bound for most clusters)",
    )


class ClusterSpec(Strict):
    """A cluster: ``nodes`` identical nodes joined by ``network``. ``node`` is resolved."""

    name: Name  # hwprofiles.names: letters, digits, . _ + - /
    nodes: int = Field(ge=1)
    node: NodeProfile
    network: Network = Network()
    measured: date | None = None
    gpu_hour_price: float | None = Field(
        default=None, gt=0, description="price of one GPU-hour (any currency); overrides the node file's"
    )
    reliability: Reliability = Reliability()
    framework: Name | None = Field(
        default=None,
        description="the training stack that runs plans on this cluster (autoplan --framework: autoplan, megatron, "
        "deepspeed, torchtitan, fsdp, llm-foundry); --framework overrides it",
    )

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
    def price_per_gpu_hour(self) -> float | None:
        """The cluster file's ``gpu_hour_price``, else the node file's, else None."""
        return self.gpu_hour_price if self.gpu_hour_price is not None else self.node.gpu_hour_price

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.node.gpus_per_node

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node
