"""Everything one ``autoplan calibrate`` run measured, gathered for the profile writer."""

from __future__ import annotations

from dataclasses import dataclass, field

from hwprofiles.calibrate.eager import EagerResult
from hwprofiles.calibrate.fit import AttentionFit, CollectiveSample, GemmFit, LinkFit
from hwprofiles.schema import AttentionPoint, GemmPoint


@dataclass(frozen=True)
class Calibration:
    # provenance
    date: str
    device: str  # "cpu" | "cuda"
    device_name: str
    torch_version: str
    host: str
    mode: str  # "quick" | "full"
    threads: int  # intra-op threads of the compute benchmarks
    host_load: str  # 1-minute load average before / after (other work on the host)
    # compute
    default_dtype: str
    peaks: dict[str, GemmPoint]  # fastest GEMM per dtype
    gemm_points: list[GemmPoint]
    gemm_fit: GemmFit
    gemm_fp8_fit: GemmFit | None  # the fp8 table's own curve; None: no fp8 GEMMs
    dispatch_us: float
    forward_op_us: float
    backward_op_us: float
    kernel_launch_us: float
    memory_bandwidth_GBps: float
    memory_efficiency: float
    memory_by_op_GBps: dict[str, float]
    attention_points: list[AttentionPoint]  # causal fused attention, FLOPs as executed
    attention_fit: AttentionFit | None  # None: no attention points
    memory_GiB: float
    memory_reserved_GiB: float
    reserved_how: str
    eager: EagerResult | None  # host time of eager blocks (None: not measured)
    # host and node
    copy_h2d_GBps: float
    copy_d2h_GBps: float
    copy_latency_us: float
    cpu_adam_GBps: float
    host_sum_GBps: float  # host fp32 a += b, bytes of one operand per second
    host_norm_GBps: float  # host gradient norm, bytes read per second
    host_memory_GiB: float
    cpu_cores: int
    compute_slots: dict[int, float] | None  # busy ranks -> slots, measured by the ranks (CPU); None: not measured
    busy_wait_s: float | None  # extra message latency while the other ranks compute (CPU, 3+ ranks); None: not measured
    sync_wait_s: dict[int, float] | None  # busy ranks -> a collective's wait after computing (CPU); None: not measured
    sync_bus_s_per_byte: dict[int, float] | None  # busy ranks -> its extra seconds per bus byte (CPU)
    gpus_per_node: int
    intra_kind: str  # Link.kind of the measured intra-node link
    # collectives (None when fewer than 2 ranks were measured)
    ranks: int
    backend: str
    link: LinkFit | None = None
    link_by_op: dict[str, LinkFit] = field(default_factory=dict)
    collective_samples: list[CollectiveSample] = field(default_factory=list)
