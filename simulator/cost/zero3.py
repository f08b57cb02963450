"""ZeRO-3 / FSDP traffic of one pipeline stage and one microbatch (analytic model; the DES
issues the same collectives layer by layer, simulator.des.program.data_parallel).

Both runtimes shard each unit's parameters (one transformer layer; the embedding and head
form one more unit on the stages that hold them) and, per microbatch:

* all-gather a unit's parameters before its forward and again before its backward (FSDP
  ``reshard_after_forward=True``, DeepSpeed stage 3 releases them after use), prefetching
  the next unit's gather under the current unit's compute (FSDP2's implicit forward
  prefetch and explicit backward prefetch of one unit; DeepSpeed's prefetch bucket);
* reduce-scatter a unit's gradients after its backward, every microbatch (FSDP without
  ``set_requires_gradient_sync(False)``; DeepSpeed's ``reduce_scatter``), in
  :func:`~simulator.cost.fsdp2_sync.reduce_bytes` per element; under ``torch.distributed.pipelining`` FSDP2 syncs once a
  step instead (simulator.cost.fsdp2_sync.deferred_sync, :func:`gathers_per_step`);
* "fsdp2" copies each gathered output into the unit's parameters on the compute stream
  (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_all_gather_copy_out``
  after waiting for the all-gather: ``split_with_sizes_copy``, read and write 2 bytes per
  parameter in bf16); "deepspeed" gathers into the parameters' storage but runs the pre-forward
  hook again in the recompute forward of a fully recomputed layer: one more gather in
  backward (deepspeed/runtime/zero/parameter_offload.py ``_pre_forward_module_hook``).

Each collective is priced as a ring over the data-parallel group with its own latency steps
(simulator.cost.collectives): per-unit messages at large d are latency-bound, and DeepSpeed, which
gathers module by module, pays them :func:`gathers_per_layer` times per layer. With hybrid
sharding (``plan.hsdp``) the gathers and reduce-scatters run inside the shard group of hsdp
consecutive data-parallel ranks (inside a node when t * hsdp fits one) and each reduced shard
is then all-reduced across the d / hsdp replicas, every microbatch (FSDP2's ``foreach_reduce``
all-reduces over the replicate group after the reduce-scatter; torch/distributed/fsdp/
_fully_shard/_fsdp_collectives.py), priced with the scatters.
Per pass, with u units, one unit's gather g = G/u (and scatter r = R/u) and C the pass's
compute, the first gather (and the last scatter) cannot hide; the rest overlap the compute
at the contention price of simulator.cost.overlap:
    forward:  g + overlap_cost(C_f, G - g) + copy_out
    backward: g + r + overlap_cost(C_b, G_b + R - g - r) + copy_out
with G_b = G (FSDP2) or G * (1 + fully recomputed fraction) (DeepSpeed).
FSDP2's ZeRO-2 (``reshard_after_forward=False``, simulator.runtime_spec.Runtime.zero2) prices the same way
with one pass of gathers (the forward's), its backward then ``r + overlap_cost(C_b, R - r)``.
On a CPU rank (gloo) FSDP2 overlaps nothing: its streams are no-ops there, each forward waits
for its unit's gather and each reduce-scatter is issued blocking, and its hooks' Python runs on
the rank's thread; the pass grows by all its traffic and copies plus :func:`fsdp2_host_time`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hwprofiles.algorithms import Collective
from hwprofiles.schema import ClusterSpec, GpuProfile
from simulator.cost import collectives, layout
from simulator.cost.fsdp2_sync import reduce_bytes
from simulator.cost.overlap import overlap_cost
from simulator.cost.stage_memory import StageLike
from simulator.cost.step import sharded_op
from simulator.numeric import maximum, where
from simulator.plan import Plan
from simulator.runtime_spec import Runtime, ScatterGather


class ShardedCollectives(Protocol):
    """The collectives of a plan's sharded states: over the shard group (``n`` ranks), and the
    all-reduce across the replicas of hybrid sharding (0 without). :class:`ShardLinks` for one
    plan; the batch estimate's figures for many (numbers or arrays)."""

    @property
    def n(self) -> Any: ...

    def all_gather(self, size_bytes: Any) -> Any: ...

    def reduce_scatter(self, size_bytes: Any) -> Any: ...

    def replica_all_reduce(self, size_bytes: Any) -> Any: ...


@dataclass(frozen=True)
class ShardLinks:
    """Where the sharded states' collectives run: the shard group (``n`` ranks) and, with hybrid
    sharding, the replicate group (``replicas`` ranks) that all-reduces each reduced shard;
    ``scatter_gather``: how the runtime runs the shard group's all-gathers and reduce-scatters
    (simulator.cost.step.sharded_op)."""

    shard: collectives.GroupLink
    n: int
    replica: collectives.GroupLink | None
    replicas: int
    scatter_gather: ScatterGather

    def all_gather(self, size_bytes: float) -> float:
        """An all-gather of ``size_bytes`` (the gathered buffer) over the shard group."""
        return collectives.collective_time(
            sharded_op(Collective.ALL_GATHER, self.scatter_gather), size_bytes, self.n, self.shard
        )

    def reduce_scatter(self, size_bytes: float) -> float:
        """A reduce-scatter of ``size_bytes`` (the input buffer) over the shard group."""
        op = sharded_op(Collective.REDUCE_SCATTER, self.scatter_gather)
        return collectives.collective_time(op, size_bytes, self.n, self.shard)

    def replica_all_reduce(self, size_bytes: float) -> float:
        """An all-reduce of ``size_bytes`` across the replicas; 0 without hybrid sharding."""
        if self.replica is None:
            return 0.0
        return collectives.all_reduce_time(size_bytes, self.replicas, self.replica)


def shard_links(cluster: ClusterSpec, plan: Plan, scatter_gather: ScatterGather) -> ShardLinks:
    """The plan's shard group (hsdp consecutive data-parallel ranks, or all d) and replicate
    group (every hsdp-th data-parallel rank) on the cluster (simulator.cost.layout). Their
    collectives run between the ranks' computations (a unit's gathers and reduce-scatters in
    its forward and backward hooks, ZeRO-1/2's gather after each rank's optimizer step), so on a
    node whose ranks outnumber its cores each step pays the busy-core wait, as the tensor-parallel
    ones do (collectives.in_pass_link: on this project's 2-core VM the 4 ranks of d = 4 with
    ZeRO-3 stepped in 0.175 s against 0.127 s predicted without it, 0.149 s with it,
    benchmarks/cpu_zero_matrix.py, 2026-11-27); 0 on a GPU node."""
    gpn = cluster.gpus_per_node
    shard = collectives.in_pass_link(cluster, layout.dp_shape(plan.t, plan.shard_group, gpn))
    if plan.replicas == 1:
        return ShardLinks(shard, plan.shard_group, None, 1, scatter_gather)
    replica = collectives.in_pass_link(cluster, layout.group_shape(plan.replicas, plan.t * plan.shard_group, gpn))
    return ShardLinks(shard, plan.shard_group, replica, plan.replicas, scatter_gather)


def sharded_reduce_time(size_bytes: Any, links: ShardedCollectives) -> Any:
    """Reduce a gradient buffer of ``size_bytes`` into shards: a reduce-scatter over the shard
    group, then (hybrid sharding) an all-reduce of the 1/n shard across the replicas."""
    return links.reduce_scatter(size_bytes) + links.replica_all_reduce(size_bytes / links.n)


def copy_out_time(gathered: float, runtime: Runtime, gpu: GpuProfile) -> float:
    """FSDP2's copy of ``gathered`` bytes of parameters out of the all-gather buffer, on the
    compute stream: each byte read and written at the HBM's elementwise rate; 0 for DeepSpeed,
    which gathers into the parameters' storage."""
    if runtime.zero3 != "fsdp2":
        return 0.0
    return 2 * gathered / (gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_efficiency)


def regather_fraction(runtime: Runtime, full_layers: Any, layers: Any) -> Any:
    """The backward's extra gathers, as a fraction of one pass's: DeepSpeed gathers each fully
    recomputed layer once more (full_layers / layers); FSDP2 none. Numbers or arrays alike."""
    return full_layers / maximum(layers, 1) if runtime.zero3 == "deepspeed" else 0.0


def gathers_per_step(zero: Any, m: Any, deferred: Any) -> Any:
    """All-gathers of each unit per step of ``m`` microbatches: :func:`gathers_per_microbatch`
    each microbatch, or with the sync deferred (:func:`~simulator.cost.fsdp2_sync.deferred_sync`) the passes that find the
    unit sharded. ZeRO-2 (``reshard_after_forward=False``) is then resharded only after the
    step's reduction: 1. ZeRO-3 reshards after each forward and not after a backward, so a
    forward that does not follow a backward and a backward that follows a forward gather: a
    stage's passes, m forwards and m backwards in any schedule's order, form k runs of forwards
    and k of backwards, first a forward and last a backward, so m - (k - 1) forwards and k
    backwards gather, m + 1 (counted under 1F1B, GPipe and interleaved 1F1B in
    benchmarks/data/fsdp2-pipeline-probe-2026-11-29.txt). Numbers or arrays alike."""
    return where(deferred, where(zero >= 3, m + 1, 1), m * gathers_per_microbatch(zero))


def gathers_per_microbatch(zero: Any) -> Any:
    """All-gathers of each unit per microbatch: ZeRO-3 (``reshard_after_forward=True``) gathers
    before the forward and again before the backward, 2; FSDP2's ZeRO-2
    (``reshard_after_forward=False``) keeps the unsharded parameters from the forward to the
    backward and reshards after it, 1 (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
    ``post_forward`` reshards only with a ``post_forward_mesh_info``, ``post_backward`` always).
    Numbers or arrays alike."""
    return where(zero >= 3, 2, 1)


#: FSDP2's host time per unit and microbatch on a CPU rank, in units of the host's per-op time
#: (the profile's ``kernel_launch_us``): (FIXED per unit, PER_TENSOR per parameter tensor), by
#: gathers per microbatch (:func:`gathers_per_microbatch`). Measured by benchmarks/
#: fsdp_host_probe.py (one gloo rank, torch 2.13 CPU, 2026-11-26, two runs at load 3.7-4.8 on
#: 2 cores, per-op time 9.1 and 7.8 us): least squares over 1, 4 and 16 tensors per unit of the
#: two runs' mean, 1282 us + 123 us/tensor (ZeRO-3) and 1562 us + 76 us/tensor (ZeRO-2; its
#: runs differ by up to 40% at a size) over a mean per-op time of 8.47 us.
FSDP2_HOST_OPS: dict[int, tuple[float, float]] = {2: (151.0, 14.5), 1: (184.0, 9.0)}


def fsdp2_host_time(units: Any, tensors: Any, gathers: Any, per_op_s: float) -> Any:
    """Seconds of FSDP2's hooks per microbatch on a synchronous (CPU) rank, for ``units`` units
    holding ``tensors`` parameter tensors in all:
        units * FIXED + tensors * PER_TENSOR, in op units of ``per_op_s``.
    Per unit and pass, FSDP2's hooks run in Python on the rank's thread
    (torch/distributed/fsdp/_fully_shard/_fsdp_state.py ``_pre_forward``/``_post_forward``/
    ``_pre_backward``, _fsdp_param_group.py ``unshard``/``wait_for_unshard``/``reshard``/
    ``post_backward``): the all-gather copy-in and copy-out (_fsdp_collectives.py
    ``foreach_all_gather``, ``foreach_all_gather_copy_out``), swapping every parameter between its
    sharded DTensor and its unsharded tensor (_fsdp_param.py ``to_unsharded``/``to_sharded``), the
    reduce-scatter's copy-in and the new sharded gradients as DTensors (``foreach_reduce``); a
    fixed part per unit and a part per tensor. On a GPU the host runs ahead of the kernels and
    this time hides behind them; on a CPU rank it adds to the step. Measured on one gloo rank
    (collectives trivial) as the forward+backward time over the plain model's
    (benchmarks/fsdp_host_probe.py): :data:`FSDP2_HOST_OPS`. Numbers or arrays alike."""
    (fixed2, per_tensor2), (fixed1, per_tensor1) = FSDP2_HOST_OPS[2], FSDP2_HOST_OPS[1]
    fixed, per_tensor = where(gathers == 2, fixed2, fixed1), where(gathers == 2, per_tensor2, per_tensor1)
    return (units * fixed + tensors * per_tensor) * per_op_s


#: the Linear modules of a transformer layer whose weights DeepSpeed stage 3 gathers, one module at a
#: time, as Megatron-DeepSpeed builds the layer (megatron/model/transformer.py ParallelAttention's
#: query_key_value and dense, ParallelMLP's dense_h_to_4h (SwiGLU's gate and up fused in it) and
#: dense_4h_to_h): every weight is far above DeepSpeed's param_persistence_threshold of 1e5 elements
#: (deepspeed/runtime/zero/config.py), below which norms and biases stay whole on every rank
DEEPSPEED_LAYER_MODULES = 4


def gathers_per_layer(runtime: Runtime) -> int:
    """All-gathers per layer and pass: FSDP (``fully_shard``, FSDP1's FlatParameter) gathers a unit,
    one layer, as one flat buffer in one collective; DeepSpeed stage 3 gathers each submodule when
    its pre-forward hook fetches it (deepspeed/runtime/zero/partitioned_param_coordinator.py
    ``fetch_sub_module``: one ``all_gather_coalesced`` per module's parameters, prefetching the next
    module's under the current one's compute), :data:`DEEPSPEED_LAYER_MODULES` per layer."""
    return DEEPSPEED_LAYER_MODULES if runtime.zero3 == "deepspeed" else 1


def gather_collectives(layers: Any, first: Any, last: Any, runtime: Runtime) -> Any:
    """All-gathers per pass of a stage of ``layers`` layers: :func:`gathers_per_layer` per layer,
    and one for the root unit (embedding, final norm, head) on a stage that holds them; at least 1.
    Each pays its ring's latency steps; together they move one pass's gathered bytes. Numbers or
    arrays alike."""
    return maximum(layers * gathers_per_layer(runtime) + (first | last), 1)


def units(layers: Any, first: Any, last: Any) -> Any:
    """Sharded units of a stage of ``layers`` layers: one per layer, plus the root unit (embedding,
    final norm, head) on a stage that holds them (``first`` or ``last``); at least 1 (the batch
    estimate's padding stages hold nothing). Numbers or arrays alike."""
    return maximum(layers + (first | last), 1)


@dataclass(frozen=True)
class Zero3Pass:
    """One microbatch's sharded-parameter traffic on one stage, seconds: ZeRO-3, or FSDP2's
    ZeRO-2 (``gathers`` = 1: the forward's gathers only, :func:`gathers_per_microbatch`).
    With the gradient sync deferred to the step's end (``deferred``, :func:`~simulator.cost.fsdp2_sync.deferred_sync`) the
    step's gathers spread over its microbatches (``gathers``: :func:`gathers_per_step` / m) and
    the reduce-scatters are not in the passes (``scatter`` = 0; simulator.analytic.data_parallel.
    dp_step_times prices them after the last backward). Numbers, or arrays in the batch estimate."""

    units: Any
    gather: Any  # all units' all-gathers, one pass
    scatter: Any  # all units' gradient reduce-scatters
    regather: Any  # DeepSpeed: the recompute forward's gathers, in backward
    copy_out: Any  # FSDP2: copying one pass's gathered parameters out, on the compute stream
    gathers: Any = 2  # passes that gather: forward and backward (ZeRO-3), forward only (FSDP2 ZeRO-2)
    host: Any = 0.0  # FSDP2's hooks on a synchronous (CPU) rank (fsdp2_host_time)
    serial: bool = False  # a synchronous rank: every collective waited for where it is issued
    collectives: Any = None  # all-gathers per pass (gather_collectives); None: one per unit
    deferred: Any = False  # the gradient sync deferred to the step's end (simulator.cost.fsdp2_sync.deferred_sync)

    @property
    def traffic(self) -> Any:
        """Network seconds per microbatch: the passes' gathers, the re-gathers and the scatters."""
        return self.gathers * self.gather + self.regather + self.scatter

    def exposed(self, forward: Any, backward: Any, sigma: float) -> Any:
        """Seconds the microbatch's passes grow by (module docstring). On a synchronous rank
        (``serial``: a CPU rank, where FSDP2's streams are no-ops, its forward waits for each
        unit's gather before that unit's compute and its reduce-scatters are issued blocking,
        _fsdp_collectives.py ``foreach_reduce``) all of it, plus FSDP2's host time. With the
        sync deferred, each pass that gathers exposes its first gather and overlaps the rest,
        half of the step's gathering passes taken as forwards and half as backwards (which ones
        gather depends on the stage's place in the schedule: :func:`gathers_per_step`)."""
        copies = self.gathers * self.copy_out
        if self.serial:
            return self.traffic + copies + self.host
        count = self.units if self.collectives is None else self.collectives
        g, r = self.gather / count, self.scatter / self.units  # the first gather and the last scatter
        fwd = g + overlap_cost(forward, self.gather - g, sigma)
        g_b = where(self.gathers == 2, g, 0.0)  # the backward's first gather, when it gathers
        behind = (self.gathers - 1) * self.gather + self.regather + self.scatter - g_b - r
        bwd = g_b + r + overlap_cost(backward, behind, sigma)
        in_forward = g + overlap_cost(forward, self.gather - g, sigma)
        in_backward = g + overlap_cost(backward, self.gather - g, sigma)
        spread = self.gathers / 2 * (in_forward + in_backward)
        return where(self.deferred, spread, fwd + bwd) + copies + self.host


def stage_scatter(cost: StageLike, links: ShardedCollectives, runtime: Runtime, e: int) -> Any:
    """Seconds of all the reduce-scatters of stage ``cost``'s gradients: one per unit
    (:func:`units`) of its share of them, in :func:`~simulator.cost.fsdp2_sync.reduce_bytes` per element. Numbers or arrays
    alike."""
    u = units(cost.layers, cost.first, cost.last)
    return u * sharded_reduce_time(cost.params * reduce_bytes(runtime, e) / u, links)


def zero3_pass(
    cost: StageLike,
    links: ShardedCollectives,
    e: int,
    gathered: Any,
    runtime: Runtime,
    gpu: GpuProfile,
    zero: Any = 3,
    host_op_s: float | None = None,
    tensors: Any = 0,
    m: Any = 1,
    deferred: Any = False,
    step_gathers: Any = 0.0,
) -> Zero3Pass:
    """The sharded-parameter traffic of stage ``cost`` for one microbatch over the plan's shard
    links; ``gathered``: the bytes of one pass's gathers (simulator.cost.precision.gathered_bytes);
    ``zero``: 3, or 2 for FSDP2's ZeRO-2. ``host_op_s``: on a synchronous (CPU) rank, its per-op
    host time with the node's cores shared (kernel_launch_us x simulator.cost.stage.
    compute_slowdown), where FSDP2 serializes its collectives and its hooks take
    :func:`fsdp2_host_time` for the stage's ``tensors`` parameter tensors (every microbatch);
    None on a GPU. ``deferred``: the gradient sync deferred to the step's end
    (:func:`~simulator.cost.fsdp2_sync.deferred_sync`) over ``m`` microbatches, each unit then
    gathered ``step_gathers`` times a step (simulator.cost.fsdp2_window.step_gathers). ``cost`` and the rest: numbers, or arrays
    of many plans' stages (the batch estimate)."""
    u = units(cost.layers, cost.first, cost.last)
    n = gathers_per_microbatch(zero)
    passes = where(deferred, step_gathers / m, n)
    count = gather_collectives(cost.layers, cost.first, cost.last, runtime)
    gather = count * links.all_gather(gathered / count)
    scatter = where(deferred, 0.0, stage_scatter(cost, links, runtime, e))
    regather = gather * regather_fraction(runtime, cost.full_layers, cost.layers)
    copy_out = copy_out_time(gathered, runtime, gpu)
    if host_op_s is None or runtime.zero3 != "fsdp2":
        return Zero3Pass(u, gather, scatter, regather, copy_out, passes, collectives=count, deferred=deferred)
    host = fsdp2_host_time(u, tensors, n, host_op_s)
    return Zero3Pass(u, gather, scatter, regather, copy_out, passes, host, True, count, deferred)
