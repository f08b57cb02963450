"""The layer-level times of one microbatch on one TP rank (:class:`BlockTimes`): a transformer
layer's, the embedding's and the head's passes, and the tensor-parallel, context-parallel and
expert-parallel communication inside them, and the cross-entropy's collectives over the split
vocabulary; with the slowdowns of ranks that share a processor or wait for the slowest GPU.
Cached per (model, cluster, t, sp, mb, precision, kernels, attention kernel, busy ranks, loss):
the search asks for the same ones thousands of times. What they are paced from
(simulator.cost.block_work: the passes' op sums, cached per model and GPU, and their
communication, per model, node and network) every cluster size of a sweep shares; each size only
paces it (:func:`paced_blocks`: the slowest-GPU factor depends on the GPU count), the batch
estimate every key of a size at once (:func:`block_times_table`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from hwprofiles.schema import AttentionKernel, ClusterSpec, GpuProfile
from simulator.cost import context, experts
from simulator.cost.attention import attention_ops
from simulator.cost.block_work import BlockInputs, block_inputs, stacked_inputs
from simulator.cost.cache import IdentityCache
from simulator.cost.ops import dtype_bytes
from simulator.cost.overlap import overlap_cost
from simulator.cost.pass_time import PassTimes, PassWork, paced, pass_times
from simulator.cost.rank_view import context_parallel
from simulator.cost.schedules import compute_share
from simulator.cost.variability import slowest_gpu_factor
from simulator.numeric import where
from simulator.plan import Plan
from simulator.runtime_spec import TP_OVERLAP, CrossEntropy, LayerKernels
from simulator.specs import ModelSpec

if TYPE_CHECKING:
    from simulator.job import Job


@dataclass(frozen=True)
class BlockTimes:
    """Seconds per microbatch on one TP rank: a transformer layer, the embedding, the head;
    and one TP all-reduce of the b*s*h activation (an all-gather + reduce-scatter with SP)."""

    layer: PassTimes
    embedding: PassTimes
    head: PassTimes
    tp_all_reduce: float
    act_bytes: float  # b*s*h*e: one boundary activation
    cp_forward: float = 0.0  # context parallelism: what the K/V ring adds to a layer's forward attention
    cp_backward: float = 0.0  # and to its backward (simulator.cost.context.ring_exposure)
    fp8_weight_cast: float = 0.0  # prec=fp8: one forward's cast of a layer's weights, where not cached
    ep_all_to_all: float = 0.0  # expert parallelism: one token all-to-all (simulator.cost.experts)
    loss_comm: float = (
        0.0  # the cross-entropy's collectives over the split vocabulary (block_comm.loss_collectives_time)
    )


# Tensor-parallel all-reduces of b*s*h per microbatch (Narayanan et al. 2021, section 3.2; with
# sequence parallelism each is an all-gather + reduce-scatter pair, Korthikanti et al. 2022):
def tp_forward(model: ModelSpec) -> float:
    """Per layer forward: after attention and after the MLP (the g operators): 2; a mixture of
    experts' MLP moves its k routed copies (simulator.cost.experts.mlp_tensor_collectives)."""
    return 1 + experts.mlp_tensor_collectives(model)


def tp_backward(model: ModelSpec) -> float:
    """Per layer backward: the f operators' conjugates, as many as forward."""
    return tp_forward(model)


def tp_per_layer(model: ModelSpec) -> float:
    return tp_forward(model) + tp_backward(model)


def tp_per_full_recompute(model: ModelSpec) -> float:
    """A fully recomputed layer runs its forward's again."""
    return tp_forward(model)


TP_EMBEDDING = 1  # the vocab-parallel embedding's forward
TP_HEAD = 1  # the vocab-parallel LM head's backward
_BLOCKS = IdentityCache(4096)
#: each GPU as a layer's attention kernel sees it (GpuProfile.for_attention), one object per
#: (GPU, kernel) so that what is cached per GPU (block_work) finds it again
_ATTENTION_GPUS = IdentityCache(64)
_SLOWDOWNS = IdentityCache(1024)  # compute_slowdown per node, ranks and busy ranks


def compute_slowdown(cluster: ClusterSpec, busy: Any = None) -> Any:
    """Ranks sharing a processor slow each other: max(1, n / compute slots at n ranks) for n
    ranks computing at once: ``busy`` (:func:`busy_ranks`; a number, or an array of many plans'),
    by default all the node's. The slots of a fractional n are interpolated linearly between the
    whole counts around it (NodeProfile.slots_for; one rank alone has one slot). Cached per
    node and rank count for one number of busy ranks (every size of a sweep asks again)."""
    if busy is None or np.ndim(busy) == 0:
        key = (cluster.gpus_per_node, None if busy is None else float(busy))
        return _SLOWDOWNS.get_or_make((cluster.node,), key, lambda: _compute_slowdown(cluster, busy))
    return _compute_slowdown(cluster, busy)


def _compute_slowdown(cluster: ClusterSpec, busy: Any) -> Any:
    gpn = cluster.gpus_per_node
    n = np.clip(gpn if busy is None else busy, 1.0, gpn)
    slots = [cluster.node.slots_for(k) for k in range(1, gpn + 1)]
    if not all(slots):
        return 1.0 if np.ndim(n) == 0 else np.ones(np.shape(n))
    low = np.floor(n).astype(int)
    table = np.array([0.0, *slots, slots[-1]], dtype=float)  # by whole rank count, one past gpn
    at = table[low] + (n - low) * (table[low + 1] - table[low])
    out = np.maximum(1.0, n / at)
    return float(out) if np.ndim(n) == 0 else out


def busy_ranks(cluster: ClusterSpec, plan: Plan, m: int) -> float | None:
    """How many of a node's ranks compute at once, on average, where they share its processor (a
    synchronous CPU node, :func:`host_async` False): all of them times the share of the step a
    pipeline rank spends in its passes (simulator.cost.schedules.compute_share). A rank waiting for
    its pipeline neighbour blocks in gloo's receive and leaves its core to the others: on this
    project's 2-core VM the 4 ranks of p = 4 with m = 4 stepped in 0.063 s, which all 4 computing
    at once would have made 0.086 s (benchmarks/cpu_zero_matrix.py, 2026-11-27). None on a GPU
    node, whose ranks each have their own device."""
    if host_async(cluster):
        return None
    return cluster.gpus_per_node * compute_share(plan.schedule, plan.p, plan.v, m)


def device_slowdown(cluster: ClusterSpec) -> float:
    """How much longer the device's work takes than one GPU's kernels alone: the job runs at its
    slowest GPU's pace (simulator.cost.variability, the GPU profile's ``speed_spread`` over the
    cluster's GPUs), and with several GPUs per node each runs at the clock a busy node holds, the
    profile's ``sustained_clock`` of its one-GPU speed:

        slowdown = slowest_gpu_factor(N, spread) / (sustained_clock if GPUs per node > 1 else 1)

    The host's issuing of kernels is not slowed."""
    clock = cluster.gpu.sustained_clock if cluster.gpus_per_node > 1 else 1.0
    return slowest_gpu_factor(cluster.num_gpus, cluster.gpu.speed_spread) / clock


def host_async(cluster: ClusterSpec) -> bool:
    """Does the device run asynchronously to its host? True for GPUs (NCCL nodes): the host
    enqueues kernels ahead; False for CPU ranks (gloo nodes), which execute their own ops."""
    return cluster.node.backend != "gloo"


def synchronous_op_seconds(cluster: ClusterSpec, busy: Any = None) -> Any:
    """The host's per-op seconds on a synchronous (CPU) rank, the node's cores shared by ``busy``
    ranks at once (kernel_launch_us x :func:`compute_slowdown`): what FSDP2's hooks, which run
    inside the passes, are priced in there (simulator.cost.zero3.zero3_pass ``host_op_s``); None
    on a GPU, whose host runs ahead. ``busy``: a number or an array, as compute_slowdown's."""
    return None if host_async(cluster) else cluster.gpu.kernel_launch_us * 1e-6 * compute_slowdown(cluster, busy)


def block_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    t: int,
    sp: bool,
    mb: int,
    prec: str = "bf16",
    kernels: LayerKernels = "fused",
    attention: AttentionKernel = "sdpa",
    busy: float | None = None,
    loss: CrossEntropy = "fp32",
) -> BlockTimes:
    """Per-microbatch times of a layer, the embedding and the head on one TP rank (cached).
    The head's vocabulary is Megatron's padded one (workload.padded_vocab_size); ``prec``: the
    plan's precision (fp8 linear layers, simulator.cost.precision); ``kernels``: the kernels a
    layer runs (simulator.runtime_spec.Runtime.layer_kernels; "eager" adds simulator.cost.eager_layer's ops);
    ``attention``: the fused attention kernel it runs, priced at the GPU's figures for it
    (Runtime.attention_kernel, GpuProfile.for_attention); ``busy``: the ranks that compute at once
    on a node whose ranks share its processor (:func:`busy_ranks`; None: all of them); ``loss``:
    how the program computes the cross-entropy (Runtime.cross_entropy: its collectives,
    simulator.cost.block_comm.loss_collectives_time)."""
    return _BLOCKS.get_or_make(
        (model, cluster),
        (t, sp, mb, prec, kernels, attention, busy, loss),
        lambda: _block_times(model, cluster, t, sp, mb, prec, kernels, attention, busy, loss),
    )


def job_block_times(job: Job) -> BlockTimes:
    """The layer-level times of ``job``'s plan as its runtime runs it: :func:`block_times` with the
    runtime's layer kernels, attention kernel and loss, and the node's busy ranks
    (:func:`busy_ranks`). The DES's passes and the CP-SAT partition's layer times read these."""
    plan, rt = job.plan, job.runtime
    return block_times(
        job.model,
        job.cluster,
        plan.t,
        bool(plan.sp),
        plan.mb,
        plan.prec,
        rt.layer_kernels,
        rt.attention_kernel,
        busy_ranks(job.cluster, plan, job.m),
        rt.loss(plan.t),
    )


def _block_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    t: int,
    sp: bool,
    mb: int,
    prec: str,
    kernels: LayerKernels,
    attention: AttentionKernel,
    busy: float | None,
    loss: CrossEntropy,
) -> BlockTimes:
    gpu = attention_gpu(cluster, attention)
    slow, dev = compute_slowdown(cluster, busy), device_slowdown(cluster)
    ring = _ring_exposure(model, cluster, gpu, t, mb, dtype_bytes(gpu), slow, host_async(cluster), dev)
    inputs = block_inputs(model, cluster, gpu, t, sp, mb, prec, kernels, loss)
    return paced_blocks(model, cluster, gpu, inputs, slow, dev, kernels, ring)


def block_times_table(
    model: ModelSpec,
    cluster: ClusterSpec,
    keys: Sequence[tuple[int, bool, int, str]],
    kernels: LayerKernels,
    attention: AttentionKernel,
    busy: Sequence[float] | None,
    losses: Sequence[CrossEntropy],
) -> BlockTimes:
    """:func:`block_times` of each (t, sp, mb, prec) of ``keys`` with each key's cross-entropy
    (``losses``: Runtime.loss of its t; with ``busy``: each key's busy ranks), as one BlockTimes
    whose fields are arrays over the keys: every key of a cluster size paced at once (the batch
    estimate), by the rule that paces one. A model split by context parallelism prices its ring
    per key (simulator.cost.context): its keys are priced one by one."""
    if context_parallel(model) > 1:
        ranks = [None] * len(keys) if busy is None else busy
        each = [
            block_times(model, cluster, t, sp, mb, prec, kernels, attention, r, loss)
            for (t, sp, mb, prec), r, loss in zip(keys, ranks, losses)
        ]
        return BlockTimes(**{f.name: _stacked([getattr(b, f.name) for b in each]) for f in fields(BlockTimes)})
    gpu = attention_gpu(cluster, attention)
    slow = compute_slowdown(cluster, None if busy is None else np.array(busy, dtype=float))
    inputs = stacked_inputs(model, cluster, gpu, keys, kernels, losses)
    return paced_blocks(model, cluster, gpu, inputs, slow, device_slowdown(cluster), kernels, (0.0, 0.0))


def _stacked(values: list[Any]) -> Any:
    """The PassTimes or numbers of each key as one of arrays."""
    if isinstance(values[0], PassTimes):
        columns: list[Any] = [np.array([getattr(v, f.name) for v in values]) for f in fields(PassTimes)]
        return PassTimes(*columns)
    return np.array(values, dtype=float)


def attention_gpu(cluster: ClusterSpec, attention: AttentionKernel) -> GpuProfile:
    """The cluster's GPU as a layer's ``attention`` kernel sees it (GpuProfile.for_attention), one
    object per GPU and kernel so that what is cached per GPU (block_work) finds it again."""
    return _ATTENTION_GPUS.get_or_make((cluster.gpu,), attention, lambda: cluster.gpu.for_attention(attention))


def paced_blocks(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpu: GpuProfile,
    inputs: BlockInputs,
    slow: Any,
    dev: float,
    kernels: LayerKernels,
    ring: tuple[Any, Any],
) -> BlockTimes:
    """The :class:`BlockTimes` of ``inputs`` (simulator.cost.block_work: one key's numbers or many
    keys' arrays) at the pace of ``cluster``: ``slow`` the slowdown of ranks sharing a processor
    (:func:`compute_slowdown`), ``dev`` the slowest GPU's (:func:`device_slowdown`), ``ring``
    context parallelism's exposure (forward, backward)."""
    asy, eager, work = host_async(cluster), gpu.eager, inputs.work

    def at_pace(w: PassWork, host_us: tuple[Any, Any] | None) -> PassTimes:
        return paced(w, gpu, slow, asy, host_us, dev)

    layer = at_pace(work.layer, inputs.layer_host_us)
    layer_fwd = layer.forward / tp_forward(model)  # the compute beside each of the forward's TP collectives
    act, all_reduce, all_to_all, loss_comm = inputs.comm
    cast = 0.0 if inputs.cast is None else where(inputs.fp8, at_pace(inputs.cast, None).forward, 0.0)
    return BlockTimes(
        layer=layer,
        embedding=at_pace(work.embedding, (eager.embedding_forward_us, eager.embedding_backward_us) if eager else None),
        head=at_pace(work.head, (eager.head_forward_us, eager.head_backward_us) if eager else None),
        tp_all_reduce=_tp_all_reduce(all_reduce, inputs.t, inputs.sp, kernels, asy, gpu, layer_fwd),
        act_bytes=act,
        cp_forward=ring[0],
        cp_backward=ring[1],
        fp8_weight_cast=cast,
        ep_all_to_all=all_to_all,
        loss_comm=loss_comm,
    )


#: the chunks Transformer Engine's userbuffers split a reduce-scatter into, each pipelined with a
#: GEMM chunk ("pipeline" method, num_splits: 4 in NeMo's H100 GPT-3 configs, NeMo-Framework-Launcher
#: conf/training/tp_overlap/ub_cfg_h100_h12288_tp4_mbs1_seqlen2048.yaml proj_fprop)
UB_PIPELINE_SPLITS = 4


def tp_overlapped(all_reduce: float, t: int, beside: float, sigma: float) -> float:
    """The critical-path seconds of one sequence-parallel all-gather + reduce-scatter pair of
    ``all_reduce`` seconds under Transformer Engine's userbuffers overlap (transformer_engine/
    pytorch/module/base.py ``initialize_ub``): the all-gather runs as a ring exchange of t chunks,
    each step's GEMM on the chunk that arrived ("ring_exchange": qkv/fc1 forward, proj/fc2
    dgrad), the reduce-scatter pipelined in UB_PIPELINE_SPLITS chunks after the GEMM's
    ("pipeline": proj/fc2 forward), the backward's others in bulk beside the wgrad GEMMs. The
    first chunk of each cannot hide; the rest runs beside ``beside`` seconds of compute at the
    contention price (simulator.cost.overlap, ``sigma`` the GPU's comm_overlap_slowdown):

        exposed = A * (1/(2t) + 1/(2 S)) + overlap_cost(beside, A - that, sigma)

    A the pair's time (half each), S = UB_PIPELINE_SPLITS. t = 4, sigma = 0.3, A well under the
    GEMMs: 0.25 A + 0.3 * 0.75 A = 0.475 A."""
    exposed = all_reduce * (0.5 / t + 0.5 / UB_PIPELINE_SPLITS)
    return exposed + overlap_cost(beside, all_reduce - exposed, sigma)


def _tp_all_reduce(
    all_reduce: Any, t: Any, sp: Any, kernels: LayerKernels, asy: bool, gpu: GpuProfile, beside: Any
) -> Any:
    """One TP all-reduce's seconds on the critical path: all of it, or with the userbuffers
    overlap (kernels "fused-tp-overlap", which Megatron runs with sequence parallelism only:
    ``validate_args`` "Tensor parallel communication/GEMM overlap can happen only when sequence
    parallelism is enabled") :func:`tp_overlapped` on a GPU. Numbers or arrays alike."""
    if kernels != TP_OVERLAP or not asy:
        return all_reduce
    overlaps = (sp != 0) & (t > 1)
    return where(overlaps, tp_overlapped(all_reduce, t, beside, gpu.comm_overlap_slowdown), all_reduce)


def _ring_exposure(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpu: GpuProfile,
    t: int,
    mb: int,
    e: int,
    slow: float,
    asy: bool,
    dev: float,
) -> tuple[float, float]:
    """Context parallelism's ring beside one layer's attention (forward, backward), priced
    against that attention's own kernels (``gpu``: the cluster's GPU as the layer's attention
    kernel sees it; simulator.cost.context.ring_exposure); 0 at cp = 1. A
    CPU rank (not ``asy``) runs its own ops and collectives one after another: nothing overlaps."""
    if context_parallel(model) == 1:
        return 0.0, 0.0
    if not asy:
        return context.ring_times(model, cluster, t, mb, e)
    heads = model.num_attention_heads // t
    attn = pass_times(attention_ops(model, mb, heads, e), gpu, slow, (), asy, None, dev)
    return context.ring_exposure(model, cluster, t, mb, e, (attn.forward, attn.backward))
