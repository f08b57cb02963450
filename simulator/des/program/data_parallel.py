"""Data-parallel traffic: gradient reductions, ZeRO-3 gathers, the tied embedding, ZeRO-1/2 gathers.

* ZeRO 0-2: a gradient bucket's reduction (:func:`simulator.cost.step.gradient_reduction`:
  all-reduce for ZeRO-0, reduce-scatter for ZeRO-1/2) once the backward produced it;
* ZeRO-3 (DeepSpeed stage 3 / FSDP): each layer's parameters all-gathered before every
  forward and every backward pass of every microbatch, one layer ahead of the compute (with
  offload the rank's shard first comes up from host memory, or NVMe then host), and its
  gradients reduce-scattered after every backward pass; FSDP2's ZeRO-2 the same, gathering
  before every forward pass only (simulator.cost.zero3.gathers_per_microbatch); under
  torch.distributed.pipelining each pass that finds its unit sharded gathers it and the
  reduce-scatters follow a chunk's last backward (simulator.des.program.compute.ChunkShards,
  deferred_reduce);
* offload: the rank's reduced gradient shard goes down to host memory over PCIe;
* tied embeddings (p > 1): the word-embedding gradient all-reduced between the first and
  the last stage after the data-parallel reduction (Megatron-LM ``finalize_model_grads``);
* ZeRO-1/2 (not FSDP2's): the updated parameters all-gathered once every member has stepped.
Volumes: ZeRO 0-1's gradients at the program's gradient bytes (simulator.cost.state_bytes.
grad_reduce_bytes; ZeRO-2/3: the runtime's reduce dtype, simulator.cost.fsdp2_sync.reduce_bytes),
each pass's parameter gathers at simulator.cost.state_bytes.param_gather_bytes, the gather after
the step at state_bytes.step_gather_bytes. Every reduce-scatter and all-gather runs as the runtime
runs it (Runtime.scatter_gather: simulator.cost.step.sharded_op, all-reduces on gloo).
A compute piece with traffic beside it is longer by the contention price of
simulator.cost.overlap (:func:`beside`).
"""

from __future__ import annotations

import functools

from hwprofiles.algorithms import Collective
from simulator.cost import collectives
from simulator.cost.fsdp2_sync import fsdp2_sharded, reduce_bytes
from simulator.cost.offload import FSDP2_OFFLOAD_BYTES
from simulator.cost.precision import gathered_bytes
from simulator.cost.state_bytes import param_gather_bytes, step_gather_bytes
from simulator.cost.step import gradient_reduction, sharded_op, tied_embedding_bytes
from simulator.cost.zero3 import gathers_per_layer, sharded_reduce_time
from simulator.des.program.state import CopyPer, Device, Program, Send
from simulator.des.transfers import TransferClass


def gather_bytes(prog: Program) -> int:
    """Bytes per parameter of a parameter all-gather (cost.state_bytes.param_gather_bytes)."""
    return param_gather_bytes(prog.costs.e)


def grad_reduce_bytes(prog: Program) -> int:
    """Bytes per gradient element of a reduction: the runtime's reduce dtype for the sharded
    stages (simulator.cost.fsdp2_sync.reduce_bytes), the gradients' dtype otherwise."""
    return reduce_bytes(prog.job.runtime, prog.costs.e) if prog.plan.zero >= 2 else prog.costs.grad_bytes


def beside(
    prog: Program, params: float, gathered: float, backward: bool, gathers: bool = True, scatters: bool = True
) -> float:
    """Closed-form seconds of the data-parallel traffic that runs beside one compute piece of
    ``params`` parameters (``gathered``: the bytes of all-gathering them), for its contention
    price (simulator.cost.overlap): with ZeRO-3 the next layer's gather when the pass
    ``gathers`` (and in backward this layer's reduce-scatter when it ``scatters``; FSDP2's
    ZeRO-2 gathers in the forward only); with bucketed ZeRO 0-2 the bucket's reduction. None
    with free communication (``DesOptions.free_comm``)."""
    plan = prog.plan
    if prog.opt.free_comm:
        return 0.0
    if plan.zero == 3 or fsdp2_sharded(plan, prog.job.runtime):
        links = prog.shard_links
        gathers = gathers and (plan.zero == 3 or not backward)  # FSDP2's ZeRO-2 gathers in the forward only
        comm = links.all_gather(gathered) if gathers else 0.0
        if backward and scatters:
            comm += sharded_reduce_time(params * grad_reduce_bytes(prog), links)
        return comm
    return collectives.collective_time(
        gradient_reduction(plan.zero, prog.job.runtime.scatter_gather),
        params * grad_reduce_bytes(prog),
        plan.d,
        prog.dp_link,
    )


def zero3_gather(
    prog: Program,
    dev: Device,
    params: float,
    gathered: float,
    pieces: list[int],
    times: float = 1.0,
    serial: bool = False,
    buffered: bool = True,
    units: int = 1,
) -> int:
    """All-gather one layer's ``params`` parameters (``gathered`` bytes), at most one layer ahead
    of the compute (``serial``, a synchronous rank: after the previous piece, none ahead), in
    :func:`simulator.cost.zero3.gathers_per_layer` collectives one after the other (DeepSpeed: one
    per module), one more for a root unit riding along (``units`` = 2, passes.root_units);
    ``times`` > 1 when DeepSpeed gathers it again for the recompute forward (simulator.cost.zero3). Its buffer (``buffered``) holds the layer's parameters at the gather
    dtype (fp8 parameters' difference is in the static fp8 term, simulator.cost.precision.
    fp8_layer_bytes); FSDP2's ZeRO-2 keeps its unsharded parameters, which the static model
    states charge (simulator.cost.memory), so its gathers add none."""
    plan, xfer = prog.plan, prog.xfer
    ahead = 1 if serial else 2
    dep = pieces[-ahead] if len(pieces) >= ahead else -1
    size = gathered * times
    shard = size / plan.d
    if prog.job.runtime.offload == "fsdp2":  # FSDP2 copies the fp32 shard up, then casts it
        shard = params * times * FSDP2_OFFLOAD_BYTES / plan.d
    if plan.offload != "none":
        if plan.offload == "nvme":
            dep = prog.transfer(
                dev,
                Send("nvme", xfer.host_class(dev.pp, "nvme"), "dptp", shard, "offload", "param read"),
                (dep,),
            )
        dep = prog.transfer(
            dev,
            Send(
                "h2d",
                xfer.host_class(dev.pp, "h2d"),
                "dptp",
                shard,
                "offload",
                "param up",
                "offload_bytes",
            ),
            (dep,),
        )
    cls, per, member = _dp_group(prog, dev, sharded_op(Collective.ALL_GATHER, prog.job.runtime.scatter_gather))
    k = gathers_per_layer(prog.job.runtime) + units - 1  # DeepSpeed: module by module (simulator.cost.zero3)
    send = Send("zero", cls, per, size / k, "zero", "param gather", "dp_bytes")
    g = prog.group_task(dev, ("z3g", len(pieces)), dep, lambda: _in_turn(prog, dev, send, k, dep), member)
    if buffered:
        prog.mem.add(g, dev.idx, False, "buffers", params * gather_bytes(prog))
    return g


def zero3_reduce_scatter(prog: Program, dev: Device, params: float, piece: int, n: int, units: int = 1) -> int:
    """Reduce-scatter one layer's gradients after its backward, one collective per sharded unit
    they belong to (``units``: 2 with the root unit, simulator.des.passes.root_units; ``n``: the
    rank's reduction count); returns the reduce-scatter's task."""
    size = params * grad_reduce_bytes(prog)
    cls, per, member = _dp_group(prog, dev, sharded_op(Collective.REDUCE_SCATTER, prog.job.runtime.scatter_gather))
    send = Send("dp", cls, per, size / units, "dp", "grad reduce-scatter", "dp_bytes")
    rs = prog.group_task(dev, ("red", n), piece, lambda: _in_turn(prog, dev, send, units, piece), member)
    prog.dp_done[dev.idx].append(_grad_down(prog, dev, _across_replicas(prog, dev, rs, size, n), size))
    return rs


def _in_turn(prog: Program, dev: Device, send: Send, count: int, dep: int) -> int:
    """``count`` transfers of ``send``, each after the one before, the first after ``dep``;
    returns the last."""
    last = dep
    for _ in range(count):
        last = prog.transfer(dev, send, (last,))
    return last


def reduce_gradients(prog: Program, dev: Device, params: float, piece: int, n: int) -> None:
    """A gradient bucket's reduction (ZeRO 0-2) after ``piece``."""
    size = params * grad_reduce_bytes(prog)
    op = gradient_reduction(prog.plan.zero, prog.job.runtime.scatter_gather)
    cls, per, member = _dp_group(prog, dev, op)
    send = Send("dp", cls, per, size, "dp", f"grad {op}", "dp_bytes")
    red = prog.group_task(dev, ("red", n), piece, lambda: prog.transfer(dev, send, (piece,)), member)
    prog.dp_done[dev.idx].append(_grad_down(prog, dev, _across_replicas(prog, dev, red, size, n), size))


def _dp_group(prog: Program, dev: Device, op: Collective) -> tuple[TransferClass, CopyPer, tuple[int, int] | None]:
    """(transfer class, copy kind, group membership) of ``op`` over ``dev``'s sharding group: the
    data-parallel group, or with hybrid sharding its shard group of hsdp consecutive ranks."""
    n = prog.plan.shard_group
    if not prog.plan.hsdp:
        return prog.xfer.dp_class(dev.pp, op), "tp", None
    return prog.xfer.shard_class(dev.pp, op, n), "shard", (dev.dp % n, dev.dp // n)


def _across_replicas(prog: Program, dev: Device, reduced: int, size: float, n: int) -> int:
    """Hybrid sharding: the reduce-scattered 1/hsdp shard all-reduced across the d / hsdp
    replicas after ``reduced`` (simulator.cost.zero3); the reduction itself otherwise."""
    plan = prog.plan
    if not plan.hsdp:
        return reduced
    k = plan.shard_group
    cls = prog.xfer.replica_class(dev.pp, k)
    send = Send("dp", cls, "replica", size / k, "dp", "grad replica all-reduce", "dp_bytes")
    member = (dev.dp // k, dev.dp % k)
    return prog.group_task(dev, ("rar", n), reduced, lambda: prog.transfer(dev, send, (reduced,)), member)


def _grad_down(prog: Program, dev: Device, reduced: int, size: float) -> int:
    """With offload, this rank's reduced gradient shard goes to host memory over PCIe; under
    FSDP2 on the link its parameter shards come up by, the two directions one after the other
    as measured (simulator.analytic.offload.fsdp2_transfer_seconds)."""
    if prog.plan.offload == "none":
        return reduced
    link = "h2d" if prog.job.runtime.offload == "fsdp2" else "d2h"
    send = Send(
        "d2h",
        prog.xfer.host_class(dev.pp, link),
        "dptp",
        size / prog.plan.d,
        "offload",
        "grad down",
        "offload_bytes",
    )
    return prog.transfer(dev, send, (reduced,))


def add_tied_embedding_all_reduce(prog: Program) -> None:
    """Tied word embeddings: the first and the last stage all-reduce their gradient."""
    if not (prog.embed_head and prog.p > 1 and prog.job.model.tie_embeddings):
        return
    size = tied_embedding_bytes(prog.job.model, prog.t, prog.costs.e)
    cls = prog.xfer.pair_all_reduce_class(0, prog.p - 1)
    for dev in prog.devices:
        if dev.pp != 0:
            continue
        other = prog.dev_at[(prog.p - 1, dev.dp, dev.tp)]
        deps = (
            [prog.pieces_of[dev.idx][-1], prog.pieces_of[other.idx][-1]]
            + prog.dp_done[dev.idx]
            + prog.dp_done[other.idx]
        )
        x = prog.transfer(dev, Send("dp", cls, "dptp", size, "dp", "embedding all-reduce", "dp_bytes"), deps)
        prog.dp_done[dev.idx].append(x)
        prog.dp_done[other.idx].append(x)


def add_param_all_gather(prog: Program) -> None:
    """ZeRO-1/2: all-gather the updated parameters once every member has stepped (not FSDP2's
    ZeRO-2, which gathers each unit before its next forward: simulator.cost.zero3), at the
    program's parameter bytes (simulator.cost.state_bytes.step_gather_bytes), as the runtime runs an
    all-gather (simulator.cost.step.sharded_op)."""
    plan, runtime = prog.plan, prog.job.runtime
    if plan.zero not in (1, 2) or plan.d == 1 or fsdp2_sharded(plan, runtime):
        return
    per_param = step_gather_bytes(prog.costs.e, runtime.states)
    op = sharded_op(Collective.ALL_GATHER, runtime.scatter_gather)
    for dev in prog.devices:
        layers = prog.device_layers(dev) * prog.costs.layer_params
        size = gathered_bytes(prog.device_params(dev), layers, per_param, plan.fp8ag)
        after = prog.opt_last[dev.idx]
        cls, per, member = _dp_group(prog, dev, op)
        label = "param all-reduce" if op == Collective.ALL_REDUCE else "param all-gather"
        send = Send("dp", cls, per, size, "dp", label, "dp_bytes")
        prog.group_task(dev, ("pag",), after, functools.partial(prog.transfer, dev, send, (after,)), member)
