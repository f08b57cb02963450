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

from simulator.cost.block_times import host_async
from simulator.cost.fsdp2_sync import fsdp2_sharded, plan_deferred_sync
from simulator.cost.fsdp2_window import resharded_before
from simulator.cost.schedules import PipeOp
from simulator.cost.step import rank_tensors
from simulator.cost.zero3 import copy_out_time, fsdp2_host_time, gathers_per_microbatch, regather_fraction, units
from simulator.des.passes import Piece
from simulator.des.program import data_parallel
from simulator.des.program.state import Device, Program, Split, pass_info
from simulator.job import Job


@dataclass(frozen=True)
class ReductionMode:
    """How a rank's gradients and parameters move around its passes."""

    zero3: bool  # per-layer parameter gathers and gradient reduce-scatters (ZeRO-3, FSDP2's ZeRO-2)
    overlap: bool  # bucketed reductions overlap the backward
    per_mb: bool  # reduce every microbatch (bucketed ZeRO-2)
    dp_sync: bool  # a bucketed data-parallel gradient reduction (ZeRO 0-2 with d > 1, not FSDP2's)
    backward_gathers: bool = True  # gather again before the backward (ZeRO-3; FSDP2's ZeRO-2 keeps them)
    serial: bool = False  # FSDP2 on a synchronous (CPU) rank: nothing prefetched, nothing overlapped
    deferred: bool = False  # FSDP2 under a pipeline: one sync per step (simulator.cost.fsdp2_sync.deferred_sync)

    @staticmethod
    def of(job: Job) -> ReductionMode:
        """The mode of ``job`` as the DES simulates it (its rank view: simulator.cost.rank_view)."""
        plan = job.plan
        fsdp2 = fsdp2_sharded(plan, job.runtime)
        dp_sync = plan.d > 1 and plan.zero < 3 and not fsdp2
        return ReductionMode(
            zero3=fsdp2
            or (plan.zero == 3 and (plan.d > 1 or plan.offload != "none")),  # offloaded params are fetched at d = 1
            overlap=dp_sync and job.runtime.dp_overlap,
            per_mb=dp_sync and plan.zero == 2,
            dp_sync=dp_sync,
            backward_gathers=plan.zero >= 3,
            serial=fsdp2 and not host_async(job.cluster),
            deferred=plan_deferred_sync(plan, job.runtime),
        )


@dataclass
class ChunkShards:
    """Where FSDP2 with a deferred sync (:class:`ReductionMode` ``deferred``) leaves one local
    chunk's units: a pass gathers them when they are sharded; a forward reshards them at
    ZeRO-3 (``reshard_after_forward``) and a backward does not (simulator.cost.zero3.
    gathers_per_step), so the parameters a backward gathered stay held (``held``, bytes of
    buffers) until the next forward or the step's reduction."""

    unsharded: bool = False
    held: float = 0.0

    def quiet(self, mode: ReductionMode, kind: str) -> bool:
        """Does a pass of ``kind`` run with nothing beside its compute (no gather, buffer freed or
        reduce-scatter, nor a synchronous rank's FSDP2 hooks): one task, as without sharding."""
        return self.unsharded and not mode.serial and not (kind == "F" and mode.backward_gathers)

    def gathered(self, kind: str, mode: ReductionMode, nbytes: float) -> None:
        """A pass of ``kind`` gathered a unit's ``nbytes``: a backward's stay held at ZeRO-3."""
        if kind == "B" and mode.backward_gathers:
            self.held += nbytes

    def resharded(self, prog: Program, dev: Device, after: int | None) -> None:
        """The chunk's units resharded (by the runtime schedule's window,
        simulator.cost.fsdp2_window.resharded_before, or after the step's reduction): the buffers
        its backwards kept freed after task ``after`` (none before the rank's first task)."""
        if self.held and after is not None:
            prog.mem.add(after, dev.idx, True, "buffers", -self.held)
        self.unsharded, self.held = False, 0.0

    def passed(self, kind: str, mode: ReductionMode) -> None:
        """After a pass of ``kind``: a forward reshards at ZeRO-3 (its buffers freed with its
        pieces) and leaves ZeRO-2 unsharded; a backward leaves the units unsharded."""
        self.unsharded = kind == "B" or not mode.backward_gathers
        self.held = self.held if kind == "B" else 0.0


@dataclass(frozen=True)
class PassSync:
    """What one pass does besides its compute: gather each unit first, free each gathered
    buffer after its unit's compute, reduce-scatter each unit's gradients after it."""

    gathers: bool
    frees: bool
    scatters: bool


def pass_sync(mode: ReductionMode, kind: str, shards: ChunkShards | None) -> PassSync:
    """The :class:`PassSync` of a pass of ``kind`` (F or B): every microbatch's per-unit
    traffic (simulator.cost.zero3), or with a deferred sync the state machine of
    :class:`ChunkShards`, whose reduce-scatters come after the chunk's last backward
    (:func:`deferred_reduce`)."""
    if shards is None:
        return PassSync(mode.zero3 and (kind == "F" or mode.backward_gathers), mode.backward_gathers, kind == "B")
    return PassSync(not shards.unsharded, kind == "F" and mode.backward_gathers, False)


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
    norec_mb, full = prog.norec_mb, prog.full
    counts = dev.idx == 0 or (dev.dp == 0 and dev.tp == 0 and any(f + s for f, s in prog.recompute))  # _count's
    shards = [ChunkShards() for _ in range(prog.v)] if mode.deferred else None
    evictions = _evictions(prog, dev, len(order)) if shards is not None else ()
    nred = 0
    for k, op in enumerate(order):
        kind, mb, local = op
        j = chunk[local]
        norec = mb == norec_mb
        if counts:
            _count(prog, dev, op, j, norec)
        for c in evictions[k] if evictions else ():
            assert shards is not None
            shards[c].resharded(prog, dev, pieces[-1] if pieces else None)
        bucketed = mode.overlap and kind == grads and (mode.per_mb or last_b[local] == k)
        chunk_shards = shards[local] if shards is not None else None
        quiet = chunk_shards is not None and chunk_shards.quiet(mode, kind)
        if not (mode.zero3 or bucketed) or quiet:  # one task, nothing beside it: _add_pass's loop, inlined
            pc = whole.get((kind, j, norec))
            if pc is None:
                pc = whole[(kind, j, norec)] = prog.pieces(kind, j, norec, "whole")[0]
            tid = task(cs, pc.dur, kind, (), pass_info((di, mb, j, "", pc.segs)))
            if shards is not None and di in prog.serial_waits:  # a deferred reduction before it
                prog.gate(tid, prog.serial_waits.pop(di))
            if full:
                piece_index[tid] = (di, len(pieces))
            pieces.append(tid)
            add_mem(tid, di, pc.start_mem, pc.end_mem)
            first[(di, kind, mb, j)] = last[(di, kind, mb, j)] = tid
        else:
            split: Split = "layers" if mode.zero3 else "buckets"
            nred = _add_pass(prog, dev, op, j, norec, split, mode, bucketed, pieces, nred, chunk_shards)
        if chunk_shards is not None and kind == grads and last_b[local] == k:
            nred = deferred_reduce(prog, dev, j, norec, mode, chunk_shards, pieces, nred)
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


def _fsdp2_host(prog: Program, j: int) -> float:
    """FSDP2's hooks per microbatch on chunk ``j`` of a synchronous rank: its units and
    parameter tensors priced by simulator.cost.zero3.fsdp2_host_time, as the closed form does."""
    op_s = prog.host_op_s
    if op_s is None:
        return 0.0
    first, last = prog.embed_head and j == 0, prog.embed_head and j == prog.chunks - 1
    layers = prog.layers[j]
    tensors = rank_tensors(prog.job.model, layers, first, last)
    return float(fsdp2_host_time(units(layers, first, last), tensors, gathers_per_microbatch(prog.plan.zero), op_s))


def _count(prog: Program, dev: Device, op: PipeOp, j: int, norec: bool) -> None:
    """TP traffic of the first rank, recomputed layers of one pipeline replica."""
    tp_bytes, tp_n, rec_f, rec_s = prog.totals(op.kind, j, norec)
    if dev.idx == 0:
        prog.counters["tp_bytes"] += tp_bytes
        prog.counters["tp_layer_all_reduces"] += tp_n
    if dev.dp == 0 and dev.tp == 0:
        prog.recomputed["full"] += rec_f
        prog.recomputed["selective"] += rec_s


def _zero3_gather(
    prog: Program, dev: Device, pc: Piece, pieces: list[int], regather: float, mode: ReductionMode
) -> int:
    """The all-gather of piece ``pc``'s first parameters before it (data_parallel.zero3_gather)."""
    return data_parallel.zero3_gather(
        prog,
        dev,
        pc.first_params,
        pc.first_gathered,
        pieces,
        regather,
        mode.serial,
        mode.backward_gathers,
        pc.first_units,
    )


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
    shards: ChunkShards | None = None,
) -> int:
    """The compute tasks of one pass; returns the rank's reduction count after it. ``shards``:
    where a deferred sync left the chunk's units (:class:`ChunkShards`), updated."""
    cs = prog.stream(dev, "compute")
    regather = _regather(prog, op, j, norec) if mode.zero3 else 1.0
    sigma = prog.job.cluster.gpu.comm_overlap_slowdown
    run = prog.pieces(op.kind, j, norec, split)
    host = _fsdp2_host(prog, j) / (len(run) * (3 if prog.plan.split_backward else 2)) if mode.serial else 0.0
    sync = pass_sync(mode, op.kind, shards)
    gathers = mode.zero3 and sync.gathers
    for gi, pc in enumerate(run):
        extra = host  # what the data-parallel traffic beside this piece, and FSDP2's hooks, cost it
        gather = -1
        if gathers:
            gather = _zero3_gather(prog, dev, pc, pieces, regather, mode)
            extra += copy_out_time(pc.first_gathered, prog.job.runtime, prog.job.cluster.gpu)
            if shards is not None:
                shards.gathered(op.kind, mode, pc.first_params * data_parallel.gather_bytes(prog))
        if mode.zero3 or bucketed:
            params = pc.first_params if mode.zero3 else pc.params
            comm = data_parallel.beside(prog, params, pc.first_gathered, op.kind == "B", gathers, sync.scatters)
            extra += sigma * min(pc.dur, comm)
        segs = (*pc.segs, ("dp", extra)) if extra > 0 else pc.segs
        tid = prog.eng.task(cs, pc.dur + extra, op.kind, (), pass_info((dev.idx, op.mb, j, "", segs)))
        if prog.full:
            prog.piece_index[tid] = (dev.idx, len(pieces))
        pieces.append(tid)
        if gather >= 0:
            prog.gate(tid, gather)
        waits = prog.serial_waits.pop(dev.idx, None)  # the reduce-scatter a synchronous rank waits for
        if waits is not None:
            prog.gate(tid, waits)
        _piece_memory(prog, dev, tid, pc, mode.zero3 and sync.frees and (gather >= 0 or shards is not None))
        if gi == 0:
            prog.first[(dev.idx, op.kind, op.mb, j)] = tid
        prog.last[(dev.idx, op.kind, op.mb, j)] = tid
        if mode.zero3 and sync.scatters:
            scatter = data_parallel.zero3_reduce_scatter(prog, dev, pc.first_params, tid, nred, pc.first_units)
            if mode.serial:
                prog.serial_waits[dev.idx] = scatter
            nred += 1
        elif bucketed:
            data_parallel.reduce_gradients(prog, dev, pc.params, tid, nred)
            nred += 1
    if shards is not None:
        shards.passed(op.kind, mode)
    return nred


def _evictions(prog: Program, dev: Device, passes: int) -> tuple[tuple[int, ...], ...]:
    """Per pass of ``dev``, the local chunks its runtime schedule reshards before it
    (simulator.cost.fsdp2_window.resharded_before); () when its order is not the one that rule
    reads."""
    plan = prog.plan
    found = resharded_before(plan.schedule, plan.p, prog.m, plan.v, dev.pp)
    return found if len(found) == passes else ()


def _piece_memory(prog: Program, dev: Device, tid: int, pc: Piece, frees: bool) -> None:
    """The memory piece ``pc`` (task ``tid``) allocates and frees, and with ``frees`` its unit's
    gathered parameters freed after this use."""
    if frees:
        prog.mem.add(tid, dev.idx, True, "buffers", -pc.first_params * data_parallel.gather_bytes(prog))
    prog.mem.add_many(tid, dev.idx, pc.start_mem, pc.end_mem)


def deferred_reduce(
    prog: Program,
    dev: Device,
    j: int,
    norec: bool,
    mode: ReductionMode,
    shards: ChunkShards,
    pieces: list[int],
    nred: int,
) -> int:
    """After chunk ``j``'s last backward, a deferred sync's reduce-scatters of its units, one
    after the other (torch/distributed/pipelining/stage.py ``perform_reduce_grad``), then the
    units resharded (the buffers its backwards kept freed); the rank's next compute waits for
    them (``perform_reduce_grad`` ends in FSDP2's ``_root_post_backward_final_callback``, whose
    ``finalize_backward`` has the compute stream wait for the reductions). Returns the rank's
    reduction count after them."""
    last = pieces[-1]
    for pc in prog.pieces("B", j, norec, "layers"):
        last = data_parallel.zero3_reduce_scatter(prog, dev, pc.first_params, last, nred, pc.first_units)
        nred += 1
    shards.resharded(prog, dev, last)
    prog.serial_waits[dev.idx] = last  # FSDP2's finalize_backward makes the compute stream wait for them
    return nred
