"""Host-side measurements for ``autoplan calibrate``: copies over PCIe (or within host memory),
the host optimizer step, memory capacity and the runtime's own footprint, and device facts.

* Copies: bandwidth = bytes / wall time of one large copy (per direction); latency = wall time
  of a 4-byte copy. CUDA: pinned host <-> device, both directions (the node's ``pcie`` link);
  CPU: a host-memory ``copy_`` of a buffer far larger than the last-level cache (a
  ``loopback`` link: what offloading moves through on a machine without GPUs).
* Host Adam: the step autoplan's program runs on the host, over ``adam_params`` fp32
  parameters: with a GPU, torch's fused AdamW on the host's intra-op threads (what an
  offloading rank steps: autoplan/runtime/trainer.py, autoplan.runtime.train.host_threads);
  on a CPU, ``torch.optim.Adam.step`` on the one thread of a CPU rank;
  cpu_adam_GBps = 12 bytes/param (fp32 master, momentum, variance: K=12 of ZeRO, docs/design.md
  section 4) / step time.
* Host gradient sum and norm: what an FSDP2-offloading rank of autoplan's program does to its
  fp32 gradients on the host (simulator.cost.offload.fsdp2_host_seconds), over a buffer of
  ``host_copy_bytes``: ``a += b`` (host_sum_GBps: bytes of one operand per second) and
  ``torch.nn.utils.get_total_norm`` over it in 64 tensors (host_norm_GBps: bytes read per second).
"""

from __future__ import annotations

import os
import platform
import resource
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hwprofiles.calibrate.settings import Settings
from hwprofiles.calibrate.timing import seconds_per_call
from hwprofiles.units import GB, GiB, KiB


@dataclass(frozen=True)
class CopyResult:
    h2d_GBps: float
    d2h_GBps: float
    latency_us: float

    @property
    def bandwidth_GBps(self) -> float:
        """Per-direction link bandwidth: the mean of the two directions."""
        return 0.5 * (self.h2d_GBps + self.d2h_GBps)


def measure_copies(settings: Settings, tick: Callable[[str], None]) -> CopyResult:
    """Large-copy bandwidth and tiny-copy latency (module docstring)."""
    n = settings.host_copy_bytes // 4
    dev = settings.device
    if dev == "cuda":
        host = torch.empty(n, pin_memory=True)
        gpu = torch.empty(n, device="cuda")
        h2d = settings.host_copy_bytes / seconds_per_call(lambda: gpu.copy_(host), dev, settings.timing) / GB
        d2h = settings.host_copy_bytes / seconds_per_call(lambda: host.copy_(gpu), dev, settings.timing) / GB
        tick("host<->device copies")
        h1, g1 = torch.empty(1, pin_memory=True), torch.empty(1, device="cuda")
        lat = 0.5 * (
            seconds_per_call(lambda: g1.copy_(h1), dev, settings.timing)
            + seconds_per_call(lambda: h1.copy_(g1), dev, settings.timing)
        )
        tick("host<->device latency")
        return CopyResult(h2d_GBps=h2d, d2h_GBps=d2h, latency_us=lat * 1e6)
    src, dst = torch.randn(n), torch.empty(n)
    bw = settings.host_copy_bytes / seconds_per_call(lambda: dst.copy_(src), dev, settings.timing) / GB
    s1, d1 = torch.empty(1), torch.empty(1)
    lat = seconds_per_call(lambda: d1.copy_(s1), dev, settings.timing)
    tick("host memory copy")
    return CopyResult(h2d_GBps=bw, d2h_GBps=bw, latency_us=lat * 1e6)


def measure_host_adam(settings: Settings, tick: Callable[[str], None]) -> float:
    """Host Adam step throughput in GB/s of fp32 optimizer state (12 bytes per parameter)."""
    p = torch.nn.Parameter(torch.randn(settings.adam_params))
    p.grad = torch.randn(settings.adam_params)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True) if settings.device == "cuda" else torch.optim.Adam([p], lr=1e-4)
    t = seconds_per_call(opt.step, "cpu", settings.timing)
    tick("host Adam step")
    return 12.0 * settings.adam_params / t / GB


@dataclass(frozen=True)
class HostRates:
    """What an offloading rank's host does per step, GB/s (module docstring)."""

    adam_GBps: float
    sum_GBps: float
    norm_GBps: float


def measure_host_rates(settings: Settings, tick: Callable[[str], None]) -> HostRates:
    """The host Adam step, and the gradient sum and norm (module docstring)."""
    adam = measure_host_adam(settings, tick)
    sum_GBps, norm_GBps = measure_host_streams(settings, tick)
    return HostRates(adam_GBps=adam, sum_GBps=sum_GBps, norm_GBps=norm_GBps)


def measure_host_streams(settings: Settings, tick: Callable[[str], None]) -> tuple[float, float]:
    """Host gradient sum and norm throughput, GB/s (module docstring)."""
    n = settings.host_copy_bytes // 4
    a, b = torch.randn(n), torch.randn(n)
    sum_s = seconds_per_call(lambda: a.add_(b), "cpu", settings.timing)
    tensors = list(a.split(max(1, n // 64)))
    norm_s = seconds_per_call(lambda: torch.nn.utils.get_total_norm(tensors), "cpu", settings.timing)
    tick("host gradient sum and norm")
    return 4 * n / sum_s / GB, 4 * n / norm_s / GB


def host_memory_GiB() -> float:
    """Physical memory of this host (sysconf pages * page size)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GiB


def resident_GiB() -> float:
    """Resident set size of this process now (/proc/self/statm; max RSS where that is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GiB
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KiB / GiB


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else cpu_model()


def device_memory_GiB(device: str, ranks: int) -> float:
    """CUDA: the device's memory. CPU: host memory / ranks (the ranks of a node share it)."""
    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory / GiB
    return host_memory_GiB() / max(ranks, 1)


def cuda_runtime_reserved_GiB() -> float:
    """Device memory in use outside PyTorch's caching allocator (context, cuBLAS workspaces)."""
    free, total = torch.cuda.mem_get_info()
    return max(0.0, (total - free - torch.cuda.memory_reserved()) / GiB)


def load_average() -> float:
    """1-minute load average of the host (runnable processes): other work disturbs the timings."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def host_name() -> str:
    return socket.gethostname()


def nvlink_present() -> bool:
    """Whether GPU 0 has an active NVLink (``nvidia-smi nvlink --status``); False if unknown."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "nvlink", "--status", "-i", "0"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GB/s" in out
