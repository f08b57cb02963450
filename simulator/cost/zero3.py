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
  :func:`reduce_bytes` per element;
* "fsdp2" copies each gathered output into the unit's parameters on the compute stream
  (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_all_gather_copy_out``
  after waiting for the all-gather: ``split_with_sizes_copy``, read and write 2 bytes per
  parameter in bf16); "deepspeed" gathers into the parameters' storage but runs the pre-forward
  hook again in the recompute forward of a fully recomputed layer: one more gather in
  backward (deepspeed/runtime/zero/parameter_offload.py ``_pre_forward_module_hook``).

Each collective is priced as a ring over the data-parallel group with its own latency steps
(simulator.cost.collectives): per-unit messages at large d are latency-bound. With hybrid
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
"""

from __future__ import annotations

from dataclasses import dataclass

from hwprofiles.schema import ClusterSpec, GpuProfile
from simulator.cost import collectives, layout
from simulator.cost.overlap import overlap_cost
from simulator.cost.stage import StageCost
from simulator.job import Runtime
from simulator.plan import Plan


def reduce_bytes(runtime: Runtime, e: int) -> int:
    """Bytes per gradient element of a ZeRO-2/3 reduce-scatter: the runtime's reduce dtype,
    never below the training dtype's (a fp32 run reduces in fp32)."""
    return max(e, runtime.sharded_reduce_bytes)


@dataclass(frozen=True)
class ShardLinks:
    """Where the sharded states' collectives run: the shard group (``n`` ranks) and, with hybrid
    sharding, the replicate group (``replicas`` ranks) that all-reduces each reduced shard."""

    shard: collectives.GroupLink
    n: int
    replica: collectives.GroupLink | None
    replicas: int


def shard_links(cluster: ClusterSpec, plan: Plan) -> ShardLinks:
    """The plan's shard group (hsdp consecutive data-parallel ranks, or all d) and replicate
    group (every hsdp-th data-parallel rank) on the cluster (simulator.cost.layout)."""
    gpn = cluster.gpus_per_node
    shard = collectives.group_link(cluster, layout.dp_shape(plan.t, plan.shard_group, gpn))
    if plan.replicas == 1:
        return ShardLinks(shard, plan.shard_group, None, 1)
    replica = collectives.group_link(cluster, layout.group_shape(plan.replicas, plan.t * plan.shard_group, gpn))
    return ShardLinks(shard, plan.shard_group, replica, plan.replicas)


def sharded_reduce_time(size_bytes: float, links: ShardLinks) -> float:
    """Reduce a gradient buffer of ``size_bytes`` into shards: a reduce-scatter over the shard
    group, then (hybrid sharding) an all-reduce of the 1/n shard across the replicas."""
    out = collectives.reduce_scatter_time(size_bytes, links.n, links.shard)
    if links.replica is not None:
        out += collectives.all_reduce_time(size_bytes / links.n, links.replicas, links.replica)
    return out


def copy_out_time(gathered: float, runtime: Runtime, gpu: GpuProfile) -> float:
    """FSDP2's copy of ``gathered`` bytes of parameters out of the all-gather buffer, on the
    compute stream: each byte read and written at the HBM's elementwise rate; 0 for DeepSpeed,
    which gathers into the parameters' storage."""
    if runtime.zero3 != "fsdp2":
        return 0.0
    return 2 * gathered / (gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_efficiency)


def regather_fraction(runtime: Runtime, full_layers: int, layers: int) -> float:
    """The backward's extra gathers, as a fraction of one pass's: DeepSpeed gathers each fully
    recomputed layer once more (full_layers / layers); FSDP2 none."""
    return full_layers / max(layers, 1) if runtime.zero3 == "deepspeed" else 0.0


def units(cost: StageCost) -> int:
    """Sharded units of a stage: one per layer, plus the root unit (embedding, final norm, head)
    on a stage that holds them."""
    return cost.layers + (1 if cost.first or cost.last else 0)


@dataclass(frozen=True)
class Zero3Pass:
    """One microbatch's ZeRO-3 traffic on one stage, seconds."""

    units: int
    gather: float  # all units' all-gathers, one pass
    scatter: float  # all units' gradient reduce-scatters
    regather: float  # DeepSpeed: the recompute forward's gathers, in backward
    copy_out: float  # FSDP2: copying one pass's gathered parameters out, on the compute stream

    @property
    def traffic(self) -> float:
        """Network seconds per microbatch: two passes of gathers, the re-gathers and the scatters."""
        return 2 * self.gather + self.regather + self.scatter

    def exposed(self, forward: float, backward: float, sigma: float) -> float:
        """Seconds the microbatch's passes grow by (module docstring)."""
        g, r = self.gather / self.units, self.scatter / self.units
        fwd = g + overlap_cost(forward, self.gather - g, sigma) + self.copy_out
        behind = self.gather + self.regather + self.scatter - g - r
        bwd = g + r + overlap_cost(backward, behind, sigma) + self.copy_out
        return fwd + bwd


def zero3_pass(
    cost: StageCost, links: ShardLinks, e: int, gathered: float, runtime: Runtime, gpu: GpuProfile
) -> Zero3Pass:
    """The ZeRO-3 traffic of stage ``cost`` for one microbatch over the plan's shard links;
    ``gathered``: the bytes of one pass's gathers (simulator.cost.precision.gathered_bytes)."""
    u = units(cost)
    gather = u * collectives.all_gather_time(gathered / u, links.n, links.shard)
    scatter = u * sharded_reduce_time(cost.params * reduce_bytes(runtime, e) / u, links)
    regather = gather * regather_fraction(runtime, cost.full_layers, cost.layers)
    return Zero3Pass(u, gather, scatter, regather, copy_out_time(gathered, runtime, gpu))
