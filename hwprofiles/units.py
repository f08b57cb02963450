"""Units, defined once. Bytes are plain numbers; these are the multipliers.

``GiB`` (2**30 bytes) for memory capacities and footprints, ``GB`` (1e9 bytes) for bandwidths
quoted in GB/s, ``MiB`` for buckets and buffers; ``US``/``NS``: seconds per microsecond and
nanosecond. Profiles name their units in the key (``memory_GiB``, ``bandwidth_GBps``,
``latency_us``: hwprofiles.schema).
"""

from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 1e9
US = 1e-6
NS = 1e-9
