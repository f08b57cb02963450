"""Per-rank measurements: step timer and peak memory (CUDA max allocated, or host RSS)."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

import torch

from hwprofiles.units import KiB


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KiB


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA max allocated on GPU; peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def peak_reserved_bytes(device: torch.device) -> int | None:
    """CUDA caching allocator's peak reserved bytes (what the allocator took from the driver:
    allocated plus its cached, fragmented blocks); None on CPU, where RSS is the one figure."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device))
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Stopwatch:
    """Wall time with device synchronization at both ends."""

    device: torch.device
    start: float = 0.0

    def __enter__(self) -> Stopwatch:
        synchronize(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.elapsed = time.perf_counter() - self.start
