"""How a training program runs what lies outside the model's math (:class:`Runtime`), and the
kinds its fields take. It sits below the cost rules that read it (simulator.cost), as
:mod:`simulator.specs` and :mod:`simulator.plan` do: it imports nothing of the simulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hwprofiles.schema import AttentionKernel

#: how the program computes the cross-entropy (:attr:`Runtime.cross_entropy`;
#: simulator.cost.memory.logits_bytes_per_element)
CrossEntropy = Literal["fp32", "torch", "split", "gathered", "fused", "chunked"]


def loss_over_whole_vocabulary(loss: CrossEntropy) -> bool:
    """Whether each tensor-parallel rank's cross-entropy runs over the whole vocabulary's logits
    rather than its V/t: "gathered" all-gathers them first (:attr:`Runtime.cross_entropy`); the
    logits it holds (simulator.cost.memory.logits_elements) and the loss's work
    (simulator.cost.workload.head_forward_ops) follow."""
    return loss == "gathered"


#: how a program keeps its model states (:attr:`Runtime.states`; simulator.cost.state_bytes.program_state_bytes)
StateLayout = Literal["mixed", "fp32-params"]
ScatterGather = Literal["native", "all-reduce"]

#: the kernels a layer runs (:attr:`Runtime.layer_kernels`; simulator.cost.eager_layer,
#: simulator.cost.block_times.tp_overlapped)
LayerKernels = Literal["fused", "fused-tp-overlap", "eager"]
EAGER: LayerKernels = "eager"
TP_OVERLAP: LayerKernels = "fused-tp-overlap"


@dataclass(frozen=True)
class Runtime:
    """How the training program schedules what lies outside the model's math.

    ``dp_overlap``: gradient reduction is bucketed and overlapped with the backward pass
    (PyTorch DDP/FSDP, Megatron-core ``--overlap-grad-reduce``, DeepSpeed with buckets).
    False: one reduction after the last backward (Megatron-LM's 2021 "local" DDP,
    Megatron-DeepSpeed with gradient bucketing off, as in the vTrain measurements).

    ``sharded_reduce_bytes``: bytes per gradient element of the ZeRO-2/3 reduce-scatter. 4 for
    FSDP2 with ``MixedPrecisionPolicy(reduce_dtype=torch.float32)`` (autoplan's program,
    autoplan/runtime/data_parallel.py; torchtitan's default ``mixed_precision_reduce =
    "float32"``; Composer's DEFAULT FSDP mixed precision); 2 for bf16 reduction (FSDP
    ``PURE``, DeepSpeed's default ``communication_data_type`` = the model's dtype).

    ``zero3``: which ZeRO-3 runtime the plan runs (simulator.cost.zero3):
    "fsdp2" (autoplan's program, autoplan/runtime/data_parallel.py, and torchtitan: PyTorch
    ``fully_shard``, each all-gather's output copied out into the parameters on the compute
    stream) or "deepspeed" (DeepSpeed stage 3: gathers into the parameters' storage, and a
    fully recomputed layer gathers its parameters once more in backward, because its
    pre-forward hook fires again in the recompute forward).

    ``cross_entropy``: how the program computes the loss, for the memory the logits take at its
    peak (simulator.cost.memory.logits_bytes_per_element): "fp32" Megatron-LM's vocab-parallel
    cross-entropy (fp32 softmax, gradient in place); "torch" ``F.cross_entropy(logits.float())``
    (autoplan's program with t = 1, autoplan.runtime.support.program_job); "split" autoplan's
    program with t > 1: the cross-entropy of each rank's V/t logits (autoplan.runtime.vocab_parallel,
    fp32 softmax kept, gradient in place); "gathered" all-gathers each rank's V/t logits to the
    whole vocabulary and runs "torch"'s loss over them (DeepSpeed's AutoTP in training: its
    ``lm_head`` a ``LinearLayer(gather_output=True)``, deepspeed/module_inject/auto_tp.py
    ``_replace``, DeepSpeed 0.19.8; the same as "torch" with t = 1); "fused" keeps only
    the e-byte logits and writes their gradient in place (flash-attn's
    ``CrossEntropyLoss(inplace_backward=True)``, llm-foundry's default ``loss_fn:
    fused_crossentropy``); "chunked" computes the head and the loss chunk by chunk of the
    sequence, each chunk's backward at once (torchtitan 0.3's ``ChunkedLossWrapper``).
    ``tensor_parallel_cross_entropy``: the loss the program computes instead on a plan with
    t > 1 (None: ``cross_entropy`` there too); :meth:`loss` picks a plan's. Both in one runtime,
    the plans of one stack with t = 1 and t > 1 share it, and the batch estimate prices them as
    one group (autoplan.frameworks.pricing.runtime_groups).

    ``weight_copy_bytes``: bytes per parameter of compute-dtype copies of the weights that the
    program holds from a layer's forward to its backward: 2 for ``torch.autocast`` over fp32
    parameters (autoplan's program without FSDP on a GPU: autocast casts each weight once per
    forward and the matmul saves the bf16 copy for backward; +2.0 bytes per parameter measured
    on an H100, benchmarks/data/h100-memory-probe.txt); 0 where the weights are kept in the
    compute dtype (Megatron-LM, DeepSpeed; FSDP2's gathered bf16 parameters are ZeRO-3's
    working set).

    ``fp8_weight_cache``: under prec=fp8, whether the fp8 copies of the weights are cast once
    per step and reused by every microbatch (Megatron-core tells Transformer Engine which
    microbatch is the first: ``is_first_microbatch``, whose docstring says setting it "allows
    caching of the FP8 versions of the weights") or cast again in every forward (TE modules
    called without it, as llm-foundry's MPT layers are; torchao float8's dynamic scaling, which
    torchtitan runs): simulator.cost.precision.weight_cast_op.

    ``layer_kernels``: the kernels a layer runs (simulator.cost.eager_layer): "fused" the fused
    list of simulator.cost.workload (Megatron-LM's kernels, a bf16 residual stream);
    "fused-tp-overlap" the same with Transformer Engine's userbuffers overlap of the
    sequence-parallel all-gathers and reduce-scatters with the GEMMs beside them (Megatron-LM
    ``--tp-comm-overlap``, NeMo's ``tp_comm_overlap``; simulator.cost.block_times.tp_overlapped);
    "eager"
    eager PyTorch under ``torch.autocast`` over fp32 parameters (autoplan's program on a GPU
    without FSDP), which adds an fp32 residual stream, per-Linear input casts and per-forward
    weight casts, fp32 gradient accumulation, and unfused rotary embeddings and GQA repeats
    (simulator.cost.eager_layer).

    ``attention_kernel``: the fused attention kernel a layer runs, priced at the GPU profile's
    figures for it (hwprofiles.schema.gpu.GpuProfile.for_attention): "sdpa" torch's
    ``F.scaled_dot_product_attention`` (autoplan's program, autoplan/runtime/model.py; torchtitan;
    Hugging Face models, whose default ``attn_implementation`` is "sdpa"); "flash-attn-2" the
    flash_attn package's kernels (llm-foundry's MPT ``attn_impl: flash``); "te-fused" Transformer
    Engine's ``DotProductAttention`` (Megatron-LM), which on Hopper prefers cuDNN's fused
    attention over FlashAttention "for performance reasons" (transformer_engine/pytorch/attention/
    dot_product_attention/utils.py ``get_attention_backend``).

    ``zero2``: how the runtime runs ZeRO-2 (simulator.cost.fsdp2_sync.fsdp2_sharded): "bucketed"
    (DeepSpeed stage 2, Megatron-LM's distributed optimizer: bucketed reduce-scatters of the
    gradients, the updated parameters all-gathered after the step) or "fsdp2" (autoplan's
    program, autoplan/runtime/data_parallel.py: ``fully_shard`` per layer and the root with
    ``reshard_after_forward=False``: each unit gathered before its forward every microbatch
    and kept to its backward, its gradients reduce-scattered after it; nothing after the step).

    ``dp_bucket_bytes``, ``dp_bucket_bytes_per_rank``: the gradient buckets the runtime reduces
    (and holds two of) with ZeRO 0-2, max(dp_bucket_bytes, dp_bucket_bytes_per_rank * d) bytes
    (simulator.cost.memory.bucket_bytes_of): PyTorch DDP's ``bucket_cap_mb=25``; Megatron-core's
    max(40M, 1M * dp) fp32 elements (megatron/core/distributed/distributed_data_parallel.py);
    DeepSpeed's ``reduce_bucket_size`` of 5e8 bf16 elements (deepspeed/runtime/zero/config.py).

    ``states``: how the program keeps its model states in memory
    (simulator.cost.state_bytes.program_state_bytes): "mixed" as Megatron-LM and DeepSpeed (e-byte
    weights and gradients, fp32 master and moments); "fp32-params" autoplan's program (fp32
    parameters and gradients, and its own ZeRO-1 buffers).

    ``scatter_gather``: how the runtime runs its data-parallel reduce-scatters and all-gathers
    (ZeRO-1's and FSDP2's; simulator.cost.step.sharded_op): "native" as themselves; "all-reduce"
    each as an in-place all-reduce of the whole buffer, an all-gather's with the other ranks'
    slots zeroed (autoplan's program on gloo: autoplan/runtime/zero1.py, gloo_comms.py). Gloo's
    reduce_scatter_tensor runs at a third of its all-reduce's bus bandwidth (localhost-cpu.yaml:
    0.44 against 1.26 GB/s), and it and all_gather_into_tensor leave transient buffers behind: 4
    gloo ranks on this project's 2-core VM kept 27-53 and 13-23 MiB after 60 calls on a 3.3 MiB
    buffer, an in-place all-reduce 3-4 MiB (benchmarks/gloo_collective_probe.py, torch 2.13,
    2026-11-30).

    ``offload``: how the runtime offloads (simulator.analytic.offload): "deepspeed"
    (ZeRO-Offload / ZeRO-Infinity: 2-byte gradients down once a step, the host Adam pipelined
    over sub-groups) or "fsdp2" (autoplan's program: FSDP2's ``CPUOffloadPolicy``, its fp32
    parameter shards up for each pass and its fp32 reduced gradient shards down each
    microbatch, the microbatches' gradients summed on the host, the gradient norm and AdamW
    on the host).

    ``grads_freed``: the program drops every parameter's ``.grad`` at each step's start (autoplan's
    program: autoplan/runtime/trainer.py ``step`` sets ``p.grad = None``), so the gradients exist
    only from the first microbatch's backward on; Megatron-LM and DeepSpeed keep contiguous
    gradient buffers for the whole run (simulator.cost.phase_memory.gradients_late).

    ``dp_buckets``: which of its gradient buckets the runtime holds (simulator.cost.memory.
    gradient_bucket_bytes): "in-flight" two of them (Megatron-core's buckets are views of its
    gradient buffer, DeepSpeed fills two of ``reduce_bucket_size``); "all" every one, a copy of
    every gradient (PyTorch DDP without ``gradient_as_bucket_view``, as autoplan's program runs
    it: autoplan/runtime/trainer.py).

    ``fsdp2_deferred_sync``: under a pipeline (p > 1) the FSDP2-sharded stages reduce-scatter
    their gradients once per step, after each stage's last backward, and keep their units
    unsharded after each backward (simulator.cost.fsdp2_sync.deferred_sync): the runtime pipelines
    with ``torch.distributed.pipelining`` (autoplan's program, torchtitan). False: FSDP2's
    every-microbatch reductions, as without a pipeline."""

    name: str = "overlapped"
    dp_overlap: bool = True
    sharded_reduce_bytes: int = 4
    zero3: Literal["fsdp2", "deepspeed"] = "fsdp2"
    cross_entropy: CrossEntropy = "fp32"
    weight_copy_bytes: float = 0.0
    states: StateLayout = "mixed"
    scatter_gather: ScatterGather = "native"
    fp8_weight_cache: bool = True
    zero2: Literal["bucketed", "fsdp2"] = "bucketed"
    layer_kernels: LayerKernels = "fused"
    attention_kernel: AttentionKernel = "sdpa"
    dp_bucket_bytes: float = 25e6
    dp_bucket_bytes_per_rank: float = 0.0
    offload: Literal["deepspeed", "fsdp2"] = "deepspeed"
    grads_freed: bool = False
    dp_buckets: Literal["in-flight", "all"] = "in-flight"
    fsdp2_deferred_sync: bool = False
    tensor_parallel_cross_entropy: CrossEntropy | None = None

    def loss(self, t: int) -> CrossEntropy:
        """The cross-entropy the program computes on a plan of ``t``-way tensor parallelism."""
        if t > 1 and self.tensor_parallel_cross_entropy is not None:
            return self.tensor_parallel_cross_entropy
        return self.cross_entropy


OVERLAPPED = Runtime("overlapped", dp_overlap=True)
NO_DP_OVERLAP = Runtime("no-dp-overlap", dp_overlap=False)
DEEPSPEED_ZERO3 = Runtime("deepspeed", dp_overlap=True, sharded_reduce_bytes=2, zero3="deepspeed")
