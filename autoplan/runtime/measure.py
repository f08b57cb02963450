"""Per-rank measurements: step timer and peak memory (CUDA max allocated, or host memory)."""

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


@dataclass(frozen=True)
class HostMemory:
    """This process's memory as Linux reports it in ``/proc/self/status`` (man 5 proc), in
    bytes: the resident set (VmRSS), its peak (VmHWM), and the resident set's anonymous part
    (RssAnon: the heap, tensors and Python objects), its file-backed part (RssFile: the pages
    of the libraries' code and data that have run) and its shared memory (RssShmem)."""

    rss: int
    peak: int
    anon: int
    file: int
    shmem: int

    def anon_peak_since(self, reset: HostMemory) -> int:
        """The anonymous memory at the resident set's peak since :func:`reset_host_peak` was
        called (``reset``: :func:`host_memory` just after): the peak less the file-backed and
        shared pages resident at the reset. Those only grow while libraries' code first runs, so
        this is the anonymous peak, or more by what they grew since (``self.file - reset.file``),
        never less."""
        return self.peak - reset.file - reset.shmem


_STATUS_FIELDS = {"VmRSS": "rss", "VmHWM": "peak", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}


def host_memory() -> HostMemory | None:
    """This process's :class:`HostMemory`, None where ``/proc/self/status`` lacks a field
    (not Linux, or a kernel before 4.5)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in _STATUS_FIELDS:
                    found[_STATUS_FIELDS[key]] = int(value.split()[0]) * KiB
    except (OSError, ValueError, IndexError):
        return None
    return HostMemory(**found) if len(found) == len(_STATUS_FIELDS) else None


def reset_host_peak() -> bool:
    """Set this process's peak resident set (VmHWM) to its resident set now, by writing 5 to
    ``/proc/self/clear_refs`` (Linux 4.0 and later, man 5 proc); False where that fails.
    ``getrusage``'s ru_maxrss is not reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


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
