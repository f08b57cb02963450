"""The step's orchestration rules: what one iteration moves and runs besides the layers' math.

The single home of each rule that both the analytic estimate (:mod:`simulator.analytic`) and
the DES program (:mod:`simulator.des.program`) apply (docs/design.md section 4.1):

* data-parallel gradient reduction: all-reduce for ZeRO-0, reduce-scatter for ZeRO-1/2/3, and
  all-reduces for the reduce-scatters and all-gathers of a runtime that runs them so
  (:func:`sharded_op`, :func:`gradient_all_reduced`); the bytes they move per element are
  simulator.cost.state_bytes';
* the optimizer: one rank steps its ``psi / d`` shard with ZeRO >= 1 (:func:`local_params`),
  over its layers' tensors plus the embedding and final-norm tensors
  (:func:`optimizer_tensors`), in :func:`optimizer_time`;
* offload: the host step is pipelined over OFFLOAD_SUBGROUPS sub-groups; the host keeps
  CPU_ADAM_STATE_BYTES per parameter (+ the fp16 parameters with ZeRO-3), which must fit in
  host memory unless it spills to NVMe (:func:`host_state_bytes`, :func:`host_fits`);
* pipeline boundaries: what one TP rank sends across a stage boundary and the extra time of
  the send (:func:`pipeline_send`);
* tied embeddings: the gradient all-reduced between the first and the last stage
  (:func:`tied_embedding_bytes`);
* every step's two scalar all-reduces (:func:`step_sync_time`).
"""

from __future__ import annotations

from typing import Any

from hwprofiles.algorithms import Collective
from hwprofiles.schema import ClusterSpec, NodeProfile
from simulator.cost import collectives, layout
from simulator.cost.block_times import compute_slowdown, device_slowdown, host_async
from simulator.cost.cache import IdentityCache
from simulator.cost.fsdp2_sync import fsdp2_sharded_by
from simulator.cost.ops import dtype_bytes
from simulator.cost.workload import layer_param_tensors, padded_vocab_size
from simulator.job import Job
from simulator.numeric import maximum, negate, where
from simulator.plan import Plan
from simulator.runtime_spec import Runtime, ScatterGather
from simulator.specs import ModelSpec

ADAM_HBM_BYTES_PER_PARAM = 28  # Adam alone: read grad, param, m, v; write param, m, v (fp32)
OPTIMIZER_STEP_BYTES_PER_PARAM = 60  # mixed-precision step with fp32 master weights (optimizer_time)
CPU_ADAM_STATE_BYTES = 16  # fp32 master, momentum, variance and gradient per parameter on the host
OFFLOAD_SUBGROUPS = 4  # the offloaded optimizer step is pipelined over this many sub-groups
NON_LAYER_TENSORS = 4  # word and position embeddings, final norm weight and bias
GRAD_NORM_BYTES, LOSS_BYTES = 8, 4  # fp64 squared norm, fp32 loss

_SYNC = IdentityCache(4096)


def sharded_op(op: Collective, scatter_gather: ScatterGather) -> Collective:
    """The collective a runtime runs for a data-parallel all-gather or reduce-scatter ``op``
    (ZeRO-1's, FSDP2's): ``op`` itself, or an all-reduce of the whole buffer where the runtime
    runs them so (Runtime.scatter_gather "all-reduce": autoplan's program on gloo)."""
    return Collective.ALL_REDUCE if scatter_gather == "all-reduce" else op


def gradient_all_reduced(zero: Any, scatter_gather: ScatterGather) -> Any:
    """Whether the data-parallel gradient reduction of ZeRO 0-2 is an all-reduce: ZeRO-0's
    (DDP), and every stage's where the runtime runs its reduce-scatters as all-reduces
    (:func:`sharded_op`); otherwise a reduce-scatter (ZeRO-1/2 keep only their shard of the
    reduced gradients; Rajbhandari et al. 2020). Numbers or arrays of ``zero`` alike."""
    return (zero == 0) | (scatter_gather == "all-reduce")


def reduction_op(all_reduced: bool) -> Collective:
    """The gradient collective :func:`gradient_all_reduced` names: all-reduce or reduce-scatter."""
    return Collective.ALL_REDUCE if all_reduced else Collective.REDUCE_SCATTER


def gradient_reduction(zero: int, scatter_gather: ScatterGather) -> Collective:
    """The data-parallel gradient collective of one plan (:func:`gradient_all_reduced`)."""
    return reduction_op(bool(gradient_all_reduced(zero, scatter_gather)))


def local_params(psi: Any, zero: Any, shard_group: Any, psi_sharded: Any = None) -> Any:
    """Parameters whose optimizer state one rank steps: its 1/d shard with ZeRO >= 1 (1/hsdp
    with hybrid sharding: every replicate group steps its own copy, ``shard_group`` the plan's
    Plan.shard_group) of ``psi_sharded`` (the sharded parameters when not ``psi``:
    simulator.cost.memory.model_state_bytes). Numbers or arrays alike."""
    return where(zero >= 1, (psi if psi_sharded is None else psi_sharded) / shard_group, psi)


def optimizer_tensors(model: ModelSpec, layers: Any) -> Any:
    """Parameter tensors one rank's optimizer visits: its ``layers`` layers' tensors plus up to
    NON_LAYER_TENSORS more (embeddings, final norm). Numbers or arrays alike."""
    return layers * layer_param_tensors(model) + NON_LAYER_TENSORS


def rank_tensors(model: ModelSpec, layers: Any, first: Any, last: Any) -> Any:
    """Parameter tensors of one rank of a stage of ``layers`` layers: its layers' and, on a stage
    holding the embedding or the head (``first`` or ``last``), the non-layer ones
    (:func:`optimizer_tensors`). Numbers or arrays alike."""
    return where(first | last, optimizer_tensors(model, layers), layers * layer_param_tensors(model))


def host_state_bytes(gpus_per_node: int, psi_local: Any, zero: Any) -> Any:
    """Host memory of a node under offload: each of its ``gpus_per_node`` ranks keeps
    CPU_ADAM_STATE_BYTES per parameter of its shard, plus the fp16 parameters with ZeRO-3
    (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity keeps them on the host too). Numbers or arrays."""
    return gpus_per_node * psi_local * (CPU_ADAM_STATE_BYTES + where(zero == 3, 2, 0))


def host_fits(node: NodeProfile, host_bytes: Any, offloaded: Any, nvme: Any) -> Any:
    """Offloaded state fits: nothing is offloaded, or it spills to NVMe (``nvme``), or it fits
    the host's memory. Numbers or arrays alike."""
    return negate(offloaded) | nvme | (host_bytes <= node.host_memory_GiB * 2**30)


def pipeline_send(cluster: ClusterSpec, plan: Plan, act_bytes: float, crosses: bool) -> tuple[float, float]:
    """(bytes each TP rank sends, extra seconds) across one pipeline boundary of a ``act_bytes``
    activation (b*s*h*e). Across nodes with t > 1 and no SP each TP rank sends 1/t and the
    receivers all-gather it over the node's links (Megatron's scatter/gather optimization,
    Narayanan et al. 2021, section 4.1); with SP each rank sends its 1/t shard; inside a node a
    receiver woken by the message waits for a busy core (collectives.in_pass_wait), and each
    message pays the ranks' sync wait (collectives.sync_wait) and the bus wait on each of its bytes
    (collectives.sync_bus_wait)."""
    t = plan.t
    if crosses and t > 1 and not plan.sp:
        intra = collectives.group_link(cluster, layout.tp_shape(t, cluster.gpus_per_node))
        return act_bytes / t, collectives.all_gather_time(act_bytes, t, intra)
    sent = act_bytes / (t if plan.sp else 1)
    if crosses:
        return sent, 0.0
    wait = collectives.in_pass_wait(cluster) + collectives.sync_wait(cluster)
    return sent, wait + collectives.sync_bus_wait(cluster) * sent


def tied_embedding_bytes(model: ModelSpec, t: int, e: int) -> float:
    """The word-embedding gradient (padded V/t x h, e bytes) that the first and the last
    stage all-reduce when p > 1 and the embeddings are tied (Megatron-LM
    ``_allreduce_embedding_grads``; DeepSpeed pipeline ``_exec_reduce_tied_grads``)."""
    return padded_vocab_size(model, t) / t * model.hidden_size * e


def step_sync_time(job: Job) -> float:
    """The two scalar all-reduces of every step, latency-bound: the squared gradient norm
    for clipping over all t*p*d ranks (autoplan.runtime.grads.clip_global_norm; DeepSpeed
    reduces it over the world, Megatron-LM over the model-parallel group after the data-
    parallel reduction) and, with d > 1, the loss average over the data-parallel group
    (Megatron-LM ``average_losses_across_data_parallel_group``). Each costs its group's latency
    steps (rings on gloo, trees on NCCL: hwprofiles.algorithms) times the link latency, and inside
    a CPU node the ranks' sync wait (collectives.sync_link)."""
    plan, cluster = job.plan, job.cluster
    return _SYNC.get_or_make((cluster,), (plan.t, plan.p, plan.d), lambda: _step_sync_time(cluster, plan))


def _step_sync_time(cluster: ClusterSpec, plan: Plan) -> float:
    gpn = cluster.gpus_per_node
    world = plan.t * plan.p * plan.d
    world_link = collectives.sync_link(cluster, layout.group_shape(world, 1, gpn))
    norm = collectives.all_reduce_time(GRAD_NORM_BYTES, world, world_link)
    if plan.d == 1:
        return norm
    dp_link = collectives.sync_link(cluster, layout.dp_shape(plan.t, plan.d, gpn))
    return norm + collectives.all_reduce_time(LOSS_BYTES, plan.d, dp_link)


def step_end_seconds(offloaded: Any, optimizer: Any, offload: Any) -> tuple[Any, Any]:
    """(optimizer seconds, offload seconds) at the step's end: the GPU's optimizer step, or with
    offload (``offloaded``) the host's instead (simulator.analytic.offload.offload_time)."""
    return where(offloaded, 0.0, optimizer), where(offloaded, offload, 0.0)


def dp_step_exposed(dp_exposed: Any, tied_embedding: Any, sync: Any) -> Any:
    """The data-parallel time a step exposes at its end: what the gradient reduction exposes, the
    tied embedding's all-reduce and the step's scalar all-reduces (:func:`step_sync_time`)."""
    return dp_exposed + (tied_embedding + sync)


def step_seconds(pipeline: Any, dp_exposed: Any, gather_after: Any, optimizer: Any, offload: Any) -> Any:
    """One iteration (simulator.analytic's module docstring): the pipeline's time, the exposed
    data-parallel time (:func:`dp_step_exposed`), the parameter all-gather after the step, the
    optimizer step or the offloaded one. Numbers or arrays alike."""
    return pipeline + dp_exposed + gather_after + optimizer + offload


def dtensor_params(t: Any, d: Any, zero: Any, runtime: Runtime) -> Any:
    """Are the rank's parameters DTensors, every optimizer op on them dispatched through DTensor
    (the profile's ``tp_optimizer_tensor_us`` per tensor, hwprofiles.schema.EagerHost): under
    tensor parallelism (t > 1), and where FSDP2 shards them (simulator.cost.fsdp2_sync.fsdp2_sharded_by),
    which keeps each sharded parameter as a DTensor (torch/distributed/fsdp/_fully_shard/
    _fsdp_param.py: ``self.sharded_param = nn.Parameter(self.to_sharded_dtensor(...))``).
    On CPU ranks (torch 2.13, the program's fused AdamW, hwprofiles.calibrate.program_optimizer)
    a step over FSDP2's parameters takes 4.0x as long per tensor as over plain ones (35.0 / 8.7 us,
    benchmarks/data/cpu-optimizer-probe.txt), the profile's tp_optimizer_tensor_us /
    optimizer_tensor_us 3.0x (41.82 / 13.75 us, localhost-cpu, 2026-11-27). Numbers or arrays alike."""
    return (t > 1) | fsdp2_sharded_by(d, zero, runtime)


def optimizer_time(job: Job, psi_local: float, param_tensors: int) -> float:
    """:func:`optimizer_seconds` of ``job``'s plan."""
    plan = job.plan
    return optimizer_seconds(
        job.cluster, psi_local, param_tensors, dtensor_params(plan.t, plan.d, plan.zero, job.runtime)
    )


def optimizer_seconds(cluster: ClusterSpec, psi_local: Any, param_tensors: Any, dtensor: Any) -> Any:
    """The optimizer step of one rank holding ``psi_local`` parameters in ``param_tensors``
    tensors (DTensors: ``dtensor``, :func:`dtensor_params`). With a calibrated eager optimizer
    (``eager.optimizer_param_ns``):
        host = param_tensors * optimizer_tensor_us (tp_optimizer_tensor_us for DTensor parameters),
        work = psi_local * optimizer_param_ns,
        step = host + work on a CPU rank, max(host, work) on a GPU (as pass_time.pass_times);
    otherwise the step streams through HBM OPTIMIZER_STEP_BYTES_PER_PARAM = 60 bytes per
    parameter (Megatron-LM FP16 optimizer / DeepSpeed FP16_Optimizer: fp16 grads to fp32 main
    grads (read 2, write 4), unscale and inf/nan check (4 + 4), gradient norm (4), clip/unscale
    multiply (4 + 4), Adam (read grad, master, m, v, write master, m, v: 28), fp32 master back
    to the fp16 parameters (4 + 2)); fp32 training (e = 4: no master copy) streams Adam's 28
    bytes; plus per tensor the eager ``optimizer_tensor_us`` when measured, else one launch.
    Ranks sharing a processor slow each other (block_times.compute_slowdown); the device's work runs
    at the slowest GPU's pace (block_times.device_slowdown). Numbers or arrays alike."""
    gpu = cluster.gpu
    eager = gpu.eager
    dev = device_slowdown(cluster)
    if eager is not None and eager.optimizer_param_ns is not None:
        host = param_tensors * where(dtensor, eager.optimizer_us(True), eager.optimizer_us(False)) * 1e-6
        work = psi_local * eager.optimizer_param_ns * 1e-9 * dev
        step = maximum(host, work) if host_async(cluster) else host + work
        return step * compute_slowdown(cluster)
    per_param = OPTIMIZER_STEP_BYTES_PER_PARAM if dtype_bytes(gpu) <= 2 else ADAM_HBM_BYTES_PER_PARAM
    stream = per_param * psi_local / (gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_efficiency) * dev
    per_tensor_us = (
        where(dtensor, eager.optimizer_us(True), eager.optimizer_us(False)) if eager else gpu.kernel_launch_us
    )
    return (stream + param_tensors * per_tensor_us * 1e-6) * compute_slowdown(cluster)
