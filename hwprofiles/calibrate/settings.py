"""What ``autoplan calibrate`` measures, per device and mode (shapes, sizes, timing budget).

CPU grids cover the shapes of the CPU verification runs: the ``tiny`` model (hidden 128,
ffn 512, vocab 512, seq 64) at microbatch 1-8 in fp32 has GEMMs with m = mb*seq = 64..512 and
n, k = 128..512 (the backward's weight-gradient GEMMs put mb*seq in k), activations of
32 KiB-2 MiB, and gloo messages of 32 KiB (tensor/pipeline parallel, mb=1) to ~3.4 MiB (the
data-parallel gradient all-reduce), so the grids reach a little beyond those on both sides.
CUDA grids cover the GEMMs and messages of large-model training (dims 256-8192,
messages up to 256 MiB).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from hwprofiles.errors import InputError
from hwprofiles.units import KiB, MiB

MIN_REPEATS = 3
#: rounds of the eager host-time benchmark: at the start, after the GEMM grid, after the host Adam step
EAGER_ROUNDS = 3
#: alternations (one rank alone, then several at once) behind each compute-slots figure; the median is kept
SLOT_ROUNDS = 5
#: rounds (idle, then busy ping-pong) behind the busy-core message wait (calibrate.wait); the median is kept
WAIT_ROUNDS = 5
#: one compute burst of the sync-wait benchmark (calibrate.wait): count, m, k, n of fp32 GEMMs on one
#: thread (~1.7 ms on this project's 2-core VM, about the compute between a small model's TP all-reduces)
BURST_GEMMS = (4, 256, 256, 512)
#: bursts, each followed by a scalar all-reduce, per round of the sync-wait benchmark
SYNC_CALLS = 100
#: the bus wait's all-reduce (calibrate.wait): about a small model's layer of fp32 parameters
BUS_BYTES = 2**20
#: back-to-back loops of it per round, the fastest taken (as the node's collective fits: calibrate.comm)
BUS_LOOPS = 3


@dataclass(frozen=True)
class Timing:
    """How long to time one measurement: loops of at least ``min_time_s``, ``repeats`` of them,
    or fewer (at least MIN_REPEATS) once ``budget_s`` of loops has run."""

    min_time_s: float
    repeats: int
    budget_s: float

    def enough(self, samples: list[float], calls: int) -> bool:
        """Whether ``samples`` (seconds per call, ``calls`` calls per loop) suffice."""
        if len(samples) >= self.repeats:
            return True
        return len(samples) >= min(MIN_REPEATS, self.repeats) and sum(samples) * calls >= self.budget_s


@dataclass(frozen=True)
class Settings:
    device: str
    quick: bool
    gemm_dims_m: tuple[int, ...]
    gemm_dims_nk: tuple[int, ...]
    gemm_dtypes: tuple[str, ...]  # first one is the profile's default dtype
    mem_elements: tuple[int, ...]  # tensor sizes (elements) of the memory-bound ops
    attention_shapes: tuple[tuple[int, int, int, int], ...]  # (batch, heads, seq, head_dim)
    host_copy_bytes: int  # large host<->device (or host memory) copy
    adam_params: int  # parameters of the host optimizer-step benchmark
    comm_bytes: tuple[int, ...]  # collective message sizes
    timing: Timing  # timed loops of the single-process benchmarks
    passes: int  # sweeps over the GEMM and memory-op grids (best kept)
    comm_timing: Timing  # timed loops of the collectives

    @property
    def eager_repeats(self) -> int:
        """Timed loops per block of the eager host-time benchmark (calibrate.eager)."""
        return 3 if self.quick else 9

    @property
    def gemm_shapes(self) -> list[tuple[int, int, int]]:
        return [(m, n, k) for m, n, k in product(self.gemm_dims_m, self.gemm_dims_nk, self.gemm_dims_nk)]

    def compute_items(self) -> int:
        """Progress-bar items of the single-process part (the ticks of calibrate.run.measure before
        the collectives: overhead 2, one per GEMM, memory op x size and attention shape, the
        copies (CUDA: bandwidth and latency), the host Adam step, the host gradient sum and norm, the eager blocks' rounds)."""
        overhead = 2
        gemm = len(self.gemm_shapes) * len(self.gemm_dtypes) * self.passes
        memory = len(MEMORY_OPS) * len(self.mem_elements) * self.passes
        copies = 2 if self.device == "cuda" else 1
        return overhead + gemm + memory + len(self.attention_shapes) + copies + 2 + EAGER_ROUNDS


#: memory-bound ops timed at every size of ``mem_elements`` (copy sets memory_bandwidth_GBps)
MEMORY_OPS: tuple[str, ...] = ("copy", "add", "scale", "gelu", "dropout", "layer_norm", "softmax")


def cuda_attention_grid() -> tuple[tuple[int, int, int, int], ...]:
    """(batch, heads, seq, head_dim) of the full CUDA attention benchmark: sequence lengths 512
    to 16384 at head dims 64 and 128 (GPT-3's and Llama's), 2^18 tokens x heads per shape
    (batch = 2^18 / (seq * heads), at least 1) so that every kernel fills the GPU."""
    return tuple(
        (max(1, (1 << 18) // (seq * heads)), heads, seq, head_dim)
        for head_dim, heads in ((64, 32), (128, 16))
        for seq in (512, 1024, 2048, 4096, 8192, 16384)
    )


def _cpu_settings(quick: bool) -> Settings:
    """The CPU grids: the tiny model's verification shapes and a little beyond (module docstring)."""
    if quick:
        return Settings(
            "cpu",
            True,
            gemm_dims_m=(64, 256, 512),
            gemm_dims_nk=(64, 256, 1024),
            gemm_dtypes=("fp32",),
            mem_elements=(1 << 14, 1 << 17, 1 << 20),
            attention_shapes=((8, 4, 64, 32),),
            host_copy_bytes=32 * MiB,
            adam_params=1 << 20,
            comm_bytes=(32 * KiB, 512 * KiB, 4 * MiB),
            timing=Timing(0.001, 8, 0.03),
            passes=1,
            comm_timing=Timing(0.01, 5, 0.1),
        )
    return Settings(
        "cpu",
        False,
        gemm_dims_m=(64, 128, 256, 512, 1024, 2048),
        gemm_dims_nk=(64, 128, 256, 512, 1024, 2048),
        gemm_dtypes=("fp32",),
        mem_elements=tuple(1 << e for e in range(12, 21)),
        attention_shapes=((1, 4, 64, 32), (8, 4, 64, 32), (8, 4, 256, 32)),
        host_copy_bytes=128 * MiB,
        adam_params=1 << 22,
        comm_bytes=(4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB),
        timing=Timing(0.001, 20, 0.2),
        passes=3,
        comm_timing=Timing(0.02, 15, 1.0),
    )


def _cuda_settings(quick: bool) -> Settings:
    """The CUDA grids: large-model training's GEMMs, attention shapes and messages (module docstring)."""
    if quick:
        return Settings(
            "cuda",
            True,
            gemm_dims_m=(256, 1024, 4096),
            gemm_dims_nk=(256, 1024, 4096),
            gemm_dtypes=("bf16", "fp16", "fp8"),
            mem_elements=(1 << 22, 1 << 26),
            attention_shapes=((4, 32, 2048, 128), (1, 32, 8192, 128)),
            host_copy_bytes=256 * MiB,
            adam_params=1 << 24,
            comm_bytes=(64 * KiB, 4 * MiB, 64 * MiB),
            timing=Timing(0.005, 3, 0.05),
            passes=1,
            comm_timing=Timing(0.02, 3, 0.1),
        )
    return Settings(
        "cuda",
        False,
        gemm_dims_m=(256, 512, 1024, 2048, 4096, 8192),
        gemm_dims_nk=(256, 512, 1024, 2048, 4096, 8192),
        gemm_dtypes=("bf16", "fp16", "fp8"),
        mem_elements=tuple(1 << e for e in range(20, 29, 2)),
        attention_shapes=cuda_attention_grid(),
        host_copy_bytes=1024 * MiB,
        adam_params=1 << 26,
        comm_bytes=tuple(1 << e for e in range(12, 29, 2)),
        timing=Timing(0.02, 5, 0.5),
        passes=1,
        comm_timing=Timing(0.1, 5, 1.0),
    )


def settings_for(device: str, quick: bool) -> Settings:
    """The grids and timing budget of one calibration (quick: well under a minute on 2 cores)."""
    if device == "cpu":
        return _cpu_settings(quick)
    if device == "cuda":
        return _cuda_settings(quick)
    raise InputError(f"unknown device {device!r}")
