"""Hardware data for autoplan: GPU, node and cluster profiles, their schema and loaders."""

from hwprofiles.errors import InputError
from hwprofiles.load import load_cluster, load_gpu, load_node
from hwprofiles.schema import ClusterSpec, GpuProfile, NodeProfile

__all__ = ["ClusterSpec", "GpuProfile", "InputError", "NodeProfile", "load_cluster", "load_gpu", "load_node"]
