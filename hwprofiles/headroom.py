"""``--memory-headroom``: GPU memory every plan must leave free, in GiB or as a share of the GPU's.

The headroom becomes the GPU profile's ``memory_headroom_GiB``, which
:attr:`hwprofiles.schema.GpuProfile.usable_memory_bytes` subtracts: the one capacity the search,
the analytic model, the DES and the reports all compare a plan's peak memory with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hwprofiles.errors import SpecError
from hwprofiles.schema import ClusterSpec, GpuProfile
from hwprofiles.units import GiB

_FORM = re.compile(r"^\s*(?P<value>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>%|GiB|G)?\s*$", re.IGNORECASE | re.ASCII)


@dataclass(frozen=True)
class MemoryHeadroom:
    """GiB (``4``, ``4GiB``) or a percentage of each GPU's memory (``10%``) to leave free."""

    text: str
    gib: float = 0.0
    fraction: float = 0.0

    @staticmethod
    def parse(text: str) -> MemoryHeadroom:
        """The headroom ``text`` asks for (ValueError with the expected forms when it is none)."""
        found = _FORM.match(text)
        if found is None:
            raise ValueError(f"expected GiB (e.g. 4 or 4GiB) or a share of the GPU's memory (e.g. 10%), got {text!r}")
        value = float(found["value"])
        if found["unit"] != "%":
            return MemoryHeadroom(text, gib=value)
        if value >= 100:
            raise ValueError(f"a share of the GPU's memory must be below 100%, got {text!r}")
        return MemoryHeadroom(text, fraction=value / 100)

    def gib_of(self, gpu: GpuProfile) -> float:
        """The headroom on ``gpu`` in GiB."""
        return self.gib + self.fraction * gpu.memory_GiB

    def apply(self, cluster: ClusterSpec) -> ClusterSpec:
        """``cluster`` with GPUs that keep this headroom free (SpecError when it leaves nothing)."""
        gpu = cluster.gpu.model_copy(update={"memory_headroom_GiB": self.gib_of(cluster.gpu)})
        if gpu.usable_memory_bytes <= 0:
            raise SpecError(
                f"--memory-headroom {self.text}: leaves no memory on the {gpu.name} "
                f"({gpu.memory_GiB:g} GiB, {cluster.gpu.usable_memory_bytes / GiB:.1f} GiB usable without it)"
            )
        return cluster.model_copy(update={"node": cluster.node.model_copy(update={"gpu": gpu})})
