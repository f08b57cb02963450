"""A GPU profile: peak rates, the GEMM efficiency model, memory, and the eager-mode host costs."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from hwprofiles.names import Name
from hwprofiles.schema.base import Strict
from hwprofiles.units import GiB


class GemmPoint(Strict):
    """One measured GEMM: C[m,n] = A[m,k] @ B[k,n] in ``dtype`` at ``tflops`` achieved."""

    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    tflops: float = Field(gt=0)
    dtype: str = "fp16"


class GemmCurve(Strict):
    """Shape-dependent GEMM efficiency (fraction of the dtype's peak):
        eff(m, n, k) = max_efficiency * prod_x (x / (x + half_dim_x)),  x in {m, n, k}
    a saturating curve: a dimension equal to its ``half_dim`` halves throughput, a large
    one costs nothing. This is the shape of cuBLAS throughput-vs-size plots (e.g. NVIDIA's
    "Matrix Multiplication Background" guide); the constants come from the profile's source."""

    max_efficiency: float = Field(gt=0, le=1)
    half_dim_m: float = Field(ge=0, default=64)
    half_dim_n: float = Field(ge=0, default=64)
    half_dim_k: float = Field(ge=0, default=64)


class GemmModel(GemmCurve):
    """The GEMM efficiency of the profile's 16-bit dtype (the curve of :class:`GemmCurve`, used
    when no measured table is present), and ``fp8``'s own curve, a fraction of the fp8 peak
    (fp8 GEMMs reach a smaller share of their doubled peak on small dimensions: the fp8 rows of
    a GPU need their own source; without one, plans with prec=fp8 are refused). When ``table``
    holds measurements (from ``autoplan calibrate``), the simulator interpolates them instead
    (see ``simulator.cost.ops.gemm_efficiency``).
    """

    table: list[GemmPoint] = Field(default_factory=list)
    fp8: GemmCurve | None = None


class AttentionPoint(Strict):
    """One measured causal fused attention (``autoplan calibrate``): (batch, heads, ``seq``,
    ``head_dim``) tensors, TFLOP/s on the FLOPs it executes (the causal half: forward
    2*b*heads*seq^2*head_dim, backward 2.5x that; FlashAttention-2, sections 3.1 and 4.1)."""

    seq: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    forward_tflops: float = Field(gt=0)
    backward_tflops: float = Field(gt=0)


class AttentionModel(Strict):
    """Efficiency of the fused (FlashAttention) kernel, a fraction of the dtype's peak on the
    FLOPs it executes (causal: half the square), as a function of the sequence length:
        eff(s) = top * s / (s + half_seq),  top = forward_efficiency or backward_efficiency
    (the backward is slower: it recomputes the scores and accumulates dQ atomically). The
    shape of FlashAttention-2's throughput-vs-length plots (Dao 2023, figures 4-7); the
    constants come from the profile's source (a fit to training runs, which it names)."""

    forward_efficiency: float = Field(gt=0, le=1)
    backward_efficiency: float = Field(gt=0, le=1)
    half_seq: float = Field(ge=0, default=512)
    table: list[AttentionPoint] = Field(default_factory=list)  # measured; interpolated when present

    def efficiency(self, seq: float, backward: bool) -> float:
        top = self.backward_efficiency if backward else self.forward_efficiency
        return top * seq / (seq + self.half_seq)


class EagerHost(Strict):
    """Host time of PyTorch eager training per pass of a block, at negligible arithmetic
    (``autoplan calibrate``, ``hwprofiles.calibrate.eager``): Python module calls, the
    dispatcher, autograd bookkeeping and, under tensor parallelism, DTensor's sharding
    propagation and redistribution. The simulator charges a pass
        synchronous (a CPU rank): sum of its ops' work + host time
        asynchronous (a GPU):    max(sum of its ops' work, host time)
    instead of ``kernel_launch_us`` per op. ``tp_layer_*``: the layer under Megatron-style
    DTensor tensor parallelism, collectives excluded (the simulator prices them on the link).
    ``optimizer_tensor_us``: AdamW step, global gradient norm and clipping, per parameter tensor;
    ``optimizer_param_ns``: the same step per parameter on large tensors (its arithmetic and
    memory passes, beyond the per-tensor host time); without it the simulator streams the
    optimizer's bytes at the elementwise bandwidth. ``tp_optimizer_tensor_us``: the step per
    tensor of the tensor-parallel layer's parameters (DTensor dispatch on every op)."""

    layer_forward_us: float = Field(ge=0)
    layer_backward_us: float = Field(ge=0)
    tp_layer_forward_us: float | None = Field(default=None, ge=0)
    tp_layer_backward_us: float | None = Field(default=None, ge=0)
    embedding_forward_us: float = Field(ge=0)
    embedding_backward_us: float = Field(ge=0)
    head_forward_us: float = Field(ge=0)
    head_backward_us: float = Field(ge=0)
    optimizer_tensor_us: float = Field(ge=0)
    optimizer_param_ns: float | None = Field(default=None, ge=0)
    tp_optimizer_tensor_us: float | None = Field(default=None, ge=0)
    llama_layer_forward_us: float | None = Field(default=None, ge=0)
    llama_layer_backward_us: float | None = Field(default=None, ge=0)

    def optimizer_us(self, tensor_parallel: bool) -> float:
        """Optimizer host time per parameter tensor; with TP the DTensor figure when measured."""
        if tensor_parallel and self.tp_optimizer_tensor_us is not None:
            return self.tp_optimizer_tensor_us
        return self.optimizer_tensor_us

    def layer_us(self, tensor_parallel: bool, llama: bool = False) -> tuple[float, float]:
        """(forward, backward) host time of a layer; with TP, the TP figures when measured
        (scaled by the Llama layer's ratio to the GPT layer for a Llama layer); ``llama``: a
        Llama layer (RMSNorm, rotary, SwiGLU), its own figures when measured."""
        fwd, bwd = self.layer_forward_us, self.layer_backward_us
        if tensor_parallel and self.tp_layer_forward_us is not None and self.tp_layer_backward_us is not None:
            fwd, bwd = self.tp_layer_forward_us, self.tp_layer_backward_us
        if llama and self.llama_layer_forward_us is not None and self.llama_layer_backward_us is not None:
            fwd *= self.llama_layer_forward_us / max(self.layer_forward_us, 1e-9)
            bwd *= self.llama_layer_backward_us / max(self.layer_backward_us, 1e-9)
        return fwd, bwd


#: the fused attention kernels a training stack runs (simulator.runtime_spec.Runtime.attention_kernel):
#: "sdpa" torch's ``F.scaled_dot_product_attention`` (the backend torch picks; what ``autoplan
#: calibrate`` measures), "flash-attn-2" the flash_attn package's FlashAttention-2 kernels,
#: "te-fused" Transformer Engine's ``DotProductAttention`` (cuDNN's fused attention on Hopper)
AttentionKernel = Literal["sdpa", "flash-attn-2", "te-fused"]

#: elementwise op kinds a profile may give a measured bandwidth for (``elementwise_GBps``)
ELEMENTWISE_KINDS = ("add", "scale", "gelu", "dropout", "layer_norm", "softmax")


class GpuProfile(Strict):
    """One accelerator: dense peak throughput per dtype, memory, and kernel efficiency."""

    name: Name  # hwprofiles.names: letters, digits, . _ + - /
    peak_tflops: dict[str, float]
    memory_GiB: float = Field(gt=0)
    memory_bandwidth_GBps: float = Field(gt=0)
    memory_efficiency: float = Field(gt=0, le=1, description="achieved / peak HBM bandwidth of elementwise kernels")
    gemm: GemmModel
    attention: AttentionModel | None = None  # fused attention (sdpa's); None: priced as its two GEMMs' shapes
    attention_kernels: dict[AttentionKernel, AttentionModel] = Field(
        default_factory=dict,
        description="fused attention kernels with figures of their own on this GPU; a kernel without an entry "
        "runs at ``attention``'s (GpuProfile.for_attention)",
    )
    kernel_launch_us: float = Field(ge=0, default=5.0)
    sustained_clock: float = Field(
        gt=0,
        le=1,
        default=1.0,
        description="the fraction of its measured one-GPU speed a GPU holds while all of its node's GPUs train "
        "(clocks under the power limit of a busy multi-GPU node, where a one-GPU benchmark runs at boost); "
        "applied to the device's work of jobs with several GPUs per node (simulator.cost.block_times.device_slowdown)",
    )
    speed_spread: float = Field(
        ge=0,
        lt=0.2,
        default=0.0,
        description="relative standard deviation of the sustained speed of GPUs of this SKU across a cluster "
        "(manufacturing variability under power management); a synchronous job runs at its slowest GPU's pace "
        "(simulator.cost.variability)",
    )
    comm_overlap_slowdown: float = Field(
        ge=0,
        default=0.3,
        description="fractional slowdown of compute kernels while a collective runs beside them (its kernels "
        "take SMs and HBM bandwidth): matmuls overlapped with NCCL collectives run 30-40% slower "
        "(pytorch/pytorch PR #179937; PR #130583; NVIDIA/nccl#338)",
    )
    memory_reserved_GiB: float = Field(ge=0, default=1.0, description="CUDA context, NCCL and library workspaces")
    allocator_fragmentation: float = Field(
        ge=0, lt=1, default=0.05, description="fraction of capacity lost to the caching allocator"
    )
    memory_headroom_GiB: float = Field(
        ge=0, default=0.0, description="memory plans must leave free, asked for with --memory-headroom"
    )
    default_dtype: str = "fp16"
    elementwise_GBps: dict[str, float] = Field(
        default_factory=dict,
        description="achieved bandwidth (bytes read+written / time) per elementwise op kind; "
        "ops without an entry run at memory_bandwidth_GBps * memory_efficiency",
    )
    eager: EagerHost | None = None
    measured: dict[str, str] | None = None

    @field_validator("elementwise_GBps")
    @classmethod
    def _known_kinds(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if k not in ELEMENTWISE_KINDS:
                raise ValueError(f"unknown elementwise op kind {k!r} (known: {', '.join(ELEMENTWISE_KINDS)})")
            if not (x > 0 and math.isfinite(x)):
                raise ValueError(f"bandwidth of {k!r} must be a positive number, got {x!r}")
        return v

    @field_validator("peak_tflops")
    @classmethod
    def _positive_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("needs at least one dtype")
        for k, x in v.items():
            if not (isinstance(x, (int, float)) and x > 0 and math.isfinite(x)):
                raise ValueError(f"peak for {k!r} must be a positive number, got {x!r}")
        return v

    @model_validator(mode="after")
    def _default_dtype_known(self) -> GpuProfile:
        if self.default_dtype not in self.peak_tflops:
            raise ValueError(f"default_dtype {self.default_dtype!r} has no entry in peak_tflops")
        return self

    def for_attention(self, kernel: AttentionKernel) -> GpuProfile:
        """This GPU as a layer running attention ``kernel`` sees it: ``attention`` replaced by the
        kernel's own figures (``attention_kernels``), itself when the kernel has none."""
        own = self.attention_kernels.get(kernel)
        return self if own is None else self.model_copy(update={"attention": own})

    def peak_flops(self, dtype: str | None = None) -> float:
        return self.peak_tflops[dtype or self.default_dtype] * 1e12

    @property
    def usable_memory_bytes(self) -> float:
        """Capacity left for tensors: total minus runtime reserve, allocator fragmentation and the
        headroom asked for."""
        lost = self.memory_reserved_GiB + self.memory_headroom_GiB
        return (self.memory_GiB * (1.0 - self.allocator_fragmentation) - lost) * GiB
