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


class ClusterSpec(Strict):
    """A cluster: ``nodes`` identical nodes joined by ``network``. ``node`` is resolved."""

    name: Name  # hwprofiles.names: letters, digits, . _ + - /
    nodes: int = Field(ge=1)
    node: NodeProfile
    network: Network = Network()
    measured: date | None = None
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
    def num_gpus(self) -> int:
        return self.nodes * self.node.gpus_per_node

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node
