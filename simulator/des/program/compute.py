"""The compute stream of a rank: one task per pass (or per layer, or per gradient bucket).

A pass of a microbatch through a pipeline chunk is one task of per-layer segments
(:mod:`simulator.des.passes`), split into per-layer tasks when ZeRO-3 gathers each layer's
parameters before it runs, and into per-bucket tasks for the chunk's last backward when
gradient buckets are reduced as the backward produces them (PyTorch DDP, Megatron-LM
``overlap_grad_reduce``). ZeRO-2 keeps only a gradient shard, so it reduces every
microbatch's gradients; without overlap (``job.runtime.dp_overlap`` False) the reductions
follow the last backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.schedules import PipeOp
from simulator.cost.zero3 import copy_out_time, regather_fraction
from simulator.des.passes import Piece
from simulator.des.program import data_parallel
from simulator.des.program.state import Device, Program, Split, pass_info
from simulator.job import Job


@dataclass(frozen=True)
class ReductionMode:
    """How a rank's gradients and parameters move around its passes."""

    zero3: bool  # per-layer parameter gathers and gradient reduce-scatters
    overlap: bool  # bucketed reductions overlap the backward
    per_mb: bool  # reduce every microbatch (ZeRO-2)
    dp_sync: bool  # any data-parallel gradient reduction (ZeRO 0-2 with d > 1)

    @staticmethod
    def of(job: Job) -> ReductionMode:
        """The mode of ``job`` as the DES simulates it (its rank view: simulator.cost.rank_view)."""
        plan = job.plan
        dp_sync = plan.d > 1 and plan.zero < 3
        return ReductionMode(
            zero3=plan.zero == 3
            and (plan.d > 1 or plan.offload != "none"),  # offloaded params are fetched even at d = 1
            overlap=dp_sync and job.runtime.dp_overlap,
            per_mb=dp_sync and plan.zero == 2,
            dp_sync=dp_sync,
        )


def add_passes(prog: Program, dev: Device) -> None:
    """Every pass of ``dev`` in schedule order, with the reductions that hang off them."""
    order = prog.orders[dev.idx]
    grads = "W" if prog.plan.split_backward else "B"  # the pass that produces the weight gradients
    last_b = {op.chunk: k for k, op in enumerate(order) if op.kind == grads}
    mode = ReductionMode.of(prog.job)
    pieces: list[int] = []  # compute tasks in stream order (ZeRO-3 prefetch distance)
    prog.pieces_of[dev.idx] = pieces
    chunk = [prog.chunk_of(dev, c) for c in range(prog.v)]  # each local chunk's model-order index
    cs = prog.stream(dev, "compute")
    whole: dict[tuple[str, int, bool], Piece] = {}  # the one piece of each pass run whole
    di, task, add_mem = dev.idx, prog.eng.task, prog.mem.add_many
    first, last, piece_index = prog.first, prog.last, prog.piece_index
    nred = 0
    for k, op in enumerate(order):
        kind, mb, local = op
        j = chunk[local]
        norec = prog.norec(op)
        _count(prog, dev, op, j, norec)
        bucketed = mode.overlap and kind == grads and (mode.per_mb or last_b[local] == k)
        if not (mode.zero3 or bucketed):  # one task, nothing beside it: _add_pass's loop, inlined (most passes)
            pc = whole.get((kind, j, norec))
            if pc is None:
                pc = whole[(kind, j, norec)] = prog.pieces(kind, j, norec, "whole")[0]
            tid = task(cs, pc.dur, kind, (), pass_info((di, mb, j, "", pc.segs)))
            piece_index[tid] = (di, len(pieces))
            pieces.append(tid)
            add_mem(tid, di, pc.start_mem, pc.end_mem)
            first[(di, kind, mb, j)] = last[(di, kind, mb, j)] = tid
        else:
            split: Split = "layers" if mode.zero3 else "buckets"
            nred = _add_pass(prog, dev, op, j, norec, split, mode, bucketed, pieces, nred)
        if mode.per_mb and not mode.overlap and op.kind == grads:
            data_parallel.reduce_gradients(prog, dev, prog.chunk_params(j), pieces[-1], nred)
            nred += 1
    if mode.dp_sync and not mode.overlap and not mode.per_mb:
        data_parallel.reduce_gradients(prog, dev, prog.device_params(dev), pieces[-1], nred)


def _regather(prog: Program, op: PipeOp, j: int, norec: bool) -> float:
    """DeepSpeed ZeRO-3 gathers a fully recomputed layer once more in backward: the backward's
    gathers scale by 1 + the chunk's fully recomputed fraction (simulator.cost.zero3)."""
    if op.kind != "B" or norec:
        return 1.0
    layers = prog.plan.chunk_layers(prog.job.model.num_layers)[j]
    full = prog.plan.chunk_recompute(prog.job.model.num_layers)[j][0]
    return 1.0 + regather_fraction(prog.job.runtime, full, layers)


def _count(prog: Program, dev: Device, op: PipeOp, j: int, norec: bool) -> None:
    """TP traffic of the first rank, recomputed layers of one pipeline replica."""
    tp_bytes, tp_n, rec_f, rec_s = prog.totals(op.kind, j, norec)
    if dev.idx == 0:
        prog.counters["tp_bytes"] += tp_bytes
        prog.counters["tp_layer_all_reduces"] += tp_n
    if dev.dp == 0 and dev.tp == 0:
        prog.recomputed["full"] += rec_f
        prog.recomputed["selective"] += rec_s


def _add_pass(
    prog: Program,
    dev: Device,
    op: PipeOp,
    j: int,
    norec: bool,
    split: Split,
    mode: ReductionMode,
    bucketed: bool,
    pieces: list[int],
    nred: int,
) -> int:
    """The compute tasks of one pass; returns the rank's reduction count after it."""
    cs = prog.stream(dev, "compute")
    regather = _regather(prog, op, j, norec) if mode.zero3 else 1.0
    sigma = prog.job.cluster.gpu.comm_overlap_slowdown
    for gi, pc in enumerate(prog.pieces(op.kind, j, norec, split)):
        extra = 0.0  # what the data-parallel traffic beside this piece costs it
        gather = -1
        if mode.zero3:
            gather = data_parallel.zero3_gather(prog, dev, pc.first_params, pc.first_gathered, pieces, regather)
            extra += copy_out_time(pc.first_gathered, prog.job.runtime, prog.job.cluster.gpu)
        if mode.zero3 or bucketed:
            params = pc.first_params if mode.zero3 else pc.params
            extra += sigma * min(pc.dur, data_parallel.beside(prog, params, pc.first_gathered, op.kind == "B"))
        segs = (*pc.segs, ("dp", extra)) if extra > 0 else pc.segs
        tid = prog.eng.task(cs, pc.dur + extra, op.kind, (), pass_info((dev.idx, op.mb, j, "", segs)))
        prog.piece_index[tid] = (dev.idx, len(pieces))
        pieces.append(tid)
        if gather >= 0:
            prog.gate(tid, gather)
            prog.mem.add(tid, dev.idx, True, "buffers", -pc.first_params * data_parallel.gather_bytes(prog))
        prog.mem.add_many(tid, dev.idx, pc.start_mem, pc.end_mem)
        if gi == 0:
            prog.first[(dev.idx, op.kind, op.mb, j)] = tid
        prog.last[(dev.idx, op.kind, op.mb, j)] = tid
        if mode.zero3 and op.kind == "B":
            data_parallel.zero3_reduce_scatter(prog, dev, pc.first_params, tid, nred)
            nred += 1
        elif bucketed:
            data_parallel.reduce_gradients(prog, dev, pc.params, tid, nred)
            nred += 1
    return nred
