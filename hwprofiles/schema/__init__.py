"""Pydantic schema of GPU, node and cluster profiles (docs/design.md section 2).

Every model forbids unknown keys, so a typo in a profile is an error, not a silently
ignored setting. Units are in the key names: ``_GBps`` is 1e9 bytes/s, ``_Gbps`` is
1e9 bits/s, ``_GiB`` is 2**30 bytes, ``_us`` is microseconds (the multipliers: hwprofiles.units).
"""

from hwprofiles.schema.cluster import ClusterSpec, Network, Reliability
from hwprofiles.schema.gpu import (
    ELEMENTWISE_KINDS,
    AttentionKernel,
    AttentionModel,
    AttentionPoint,
    EagerHost,
    GemmCurve,
    GemmModel,
    GemmPoint,
    GpuProfile,
)
from hwprofiles.schema.node import CollectiveFit, CollectiveName, Link, NodeProfile, Nvme

__all__ = [
    "ELEMENTWISE_KINDS",
    "AttentionKernel",
    "AttentionModel",
    "AttentionPoint",
    "ClusterSpec",
    "CollectiveFit",
    "CollectiveName",
    "EagerHost",
    "GemmCurve",
    "GemmModel",
    "GemmPoint",
    "GpuProfile",
    "Link",
    "Network",
    "NodeProfile",
    "Nvme",
    "Reliability",
]
