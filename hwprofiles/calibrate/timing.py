"""Wall-clock timing of one torch call for ``autoplan calibrate``.

Method: one warm-up call, then loops of ``n`` back-to-back calls with the device synchronized
after each loop; ``n`` grows until a loop lasts ``min_time_s``; the result is the smallest,
over ``repeats`` such loops (fewer, but at least 3, once the loops have taken ``budget_s``),
of the loop time / n. A loop mean (not the fastest single call) is what a training step, a
sum of many ops, experiences; the best of many short loops is the machine's own speed, free
of the loops another process on a shared host disturbed (the practice of Python's
``timeit``: "the min ... is the most meaningful"). On CUDA the final synchronize makes the
loop time the GPU time of the kernels (or the host launch time when that is longer, as it is
for tiny kernels); ``gpu_seconds_per_call`` hides the host time to get the kernels' own.

Clock: on CPU the calling thread's CPU time (``time.thread_time``, CLOCK_THREAD_CPUTIME_ID,
user + system), which is the op's own time since every CPU benchmark runs in this one thread
(``torch.set_num_threads(1)``) and which leaves out the time other processes on a shared
host hold the core; on CUDA the wall clock (``time.perf_counter``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from hwprofiles.calibrate.settings import Timing

#: profile dtype names -> torch dtypes
TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

#: on CPU an op's compute time is its wall time less the dispatch time, but never below this
#: fraction of the wall time (a shape that small is all overhead and cannot be resolved)
MIN_NET_FRACTION = 0.2


def clock(device: str) -> Callable[[], float]:
    """Seconds now: this thread's CPU time on CPU, the wall clock on CUDA (module docstring)."""
    return time.thread_time if device == "cpu" else time.perf_counter


def synchronizer(device: str) -> Callable[[], None]:
    """A function that waits for the device's queued work (a no-op on CPU)."""
    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def seconds_per_call(fn: Callable[[], object], device: str, timing: Timing, max_calls: int = 1 << 20) -> float:
    """Best over the timed loops (module docstring) of the mean time of one ``fn()`` call (s)."""
    sync, now = synchronizer(device), clock(device)
    fn()
    sync()
    n, samples = 1, []
    while True:
        t0 = now()
        for _ in range(n):
            fn()
        sync()
        dt = now() - t0
        if dt >= timing.min_time_s or n >= max_calls:
            samples.append(dt / n)
            break
        n = min(max_calls, n * 2 if dt <= 0 else max(n * 2, int(n * timing.min_time_s / dt * 1.2)))
    while not timing.enough(samples, n):
        t0 = now()
        for _ in range(n):
            fn()
        sync()
        samples.append((now() - t0) / n)
    return min(samples)


_CYCLES_PER_S: float | None = None


def _sleep_cycles_per_s() -> float:
    """Clock cycles per second of ``torch.cuda._sleep`` (a spin kernel), timed with CUDA events."""
    global _CYCLES_PER_S
    if _CYCLES_PER_S is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _CYCLES_PER_S = cycles / max(start.elapsed_time(end) * 1e-3, 1e-6)
    return _CYCLES_PER_S


def gpu_seconds_per_call(fn: Callable[[], object], timing: Timing, max_calls: int = 256) -> float:
    """CUDA: device time of one ``fn()`` with the host's launch time hidden.

    A spin kernel (``torch.cuda._sleep``) long enough to cover the host's enqueueing of ``n``
    calls goes first, so the ``n`` kernels then run back to back; CUDA events around them give
    the device time (Triton's ``do_bench`` and nvbench time kernels the same way). ``n`` is at
    most ``max_calls`` so the launch queue never fills. Best of the timed loops.
    """
    # wall time per call: at least the host's launch time and at least the device time
    wall = seconds_per_call(fn, "cuda", Timing(timing.min_time_s / 4, 1, 0.0))
    n = int(max(1, min(max_calls, timing.min_time_s / max(wall, 1e-9))))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rate = _sleep_cycles_per_s()
    samples: list[float] = []
    while not samples or not timing.enough(samples, n):
        torch.cuda._sleep(int(rate * (n * wall * 1.5 + 1e-3)))
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3 / n)
    return min(samples)


def raw_seconds(fn: Callable[[], object], device: str, timing: Timing) -> float:
    """CPU: time per call (``seconds_per_call``), dispatch included; CUDA: the device time
    (``gpu_seconds_per_call``), the host launch already hidden."""
    return gpu_seconds_per_call(fn, timing) if device == "cuda" else seconds_per_call(fn, device, timing)


def work_seconds(raw_s: float, dispatch_s: float, device: str) -> float:
    """Time of one op's work alone, without the per-op overhead the simulator adds separately:
    on CPU ``raw_s`` less ``dispatch_s`` (the same op on a tiny tensor), floored at
    MIN_NET_FRACTION of ``raw_s``; on CUDA ``raw_s`` itself."""
    if device == "cuda":
        return raw_s
    return max(raw_s - dispatch_s, MIN_NET_FRACTION * raw_s)


def op_seconds(fn: Callable[[], object], device: str, timing: Timing, dispatch_s: float) -> float:
    """``work_seconds`` of one measurement of ``fn``."""
    return work_seconds(raw_seconds(fn, device, timing), dispatch_s, device)
