"""The task graph of one training iteration of a plan, built on the event engine.

For every simulated rank (symmetric mode: one per pipeline stage, standing for its tensor
group and every data-parallel replica; ``full``: every rank of the cluster):

* compute: one task per pass of a microbatch through a pipeline chunk (forward, or
  recompute + backward) made of per-layer segments (:mod:`simulator.des.passes`); TP
  collectives run synchronously on the compute stream as in Megatron-LM. A pass is split
  into per-layer tasks where something must happen between layers: gradient buckets of the
  chunk's last backward, ZeRO-3 parameter gathers.
* pipeline sends: one network transfer per boundary and microbatch of b*s*h elements on
  the sender's PP stream (forward and backward directions on separate streams); the
  receiver's pass waits for it, and (``DesOptions.blocking_p2p``, Megatron-LM) so does the
  sender's next pass. With t > 1 across nodes (no SP) each TP rank
  sends b*s*h/t over its own NIC and the receivers all-gather over NVLink (Megatron's
  scatter/gather, Narayanan et al. 2021, 4.1); with SP each rank sends its b*s*h/t shard.
* data parallelism (ZeRO 0-2): gradients in ~25 MB buckets (whole layers, backward order)
  reduced as soon as the chunk's last backward produced them (all-reduce for ZeRO-0,
  reduce-scatter for ZeRO-1/2), or all at once after the last backward when the runtime
  does not overlap (``job.runtime.dp_overlap``); the tied embedding's
  gradient all-reduce between first and last stage after that (Megatron-LM
  ``finalize_model_grads``); the optimizer step; then (ZeRO-1/2) the updated parameters'
  all-gather.
* ZeRO-3 (DeepSpeed / FSDP): each layer's parameters all-gathered before every forward and
  every backward pass of every microbatch, one layer ahead of the compute, and its
  gradients reduce-scattered after every backward pass (1.5x the all-reduce volume per
  microbatch).
* offload (ZeRO-Offload/Infinity): each rank's reduced gradient shard goes down over PCIe,
  the optimizer step runs on the host CPU (a link of ``cpu_adam_GBps`` that the node's ranks
  share), updated fp16 shards come back up and are all-gathered; with NVMe the optimizer
  state is read before and written after the step, and ZeRO-3 parameters are staged
  NVMe -> host -> GPU before each layer's gather.
Volumes follow :mod:`simulator.analytic`: gradients e bytes per parameter, parameters
min(e, 2), CPU Adam 16 bytes of state per parameter, the optimizer step's HBM streaming.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from simulator.analytic import CPU_ADAM_STATE_BYTES, optimizer_time, step_sync_time
from simulator.des.engine import Engine
from simulator.cost.layout import rank_of, tp_shape
from simulator.cost.collectives import allgather_time, group_link, in_pass_wait
from simulator.cost.memory import DP_BUCKET_BYTES, gradient_bucket_bytes, model_state_bytes, pipeline_buffer_bytes
from simulator.des.memtimeline import MemoryTimeline
from simulator.des.passes import Costs, Piece, bucket_groups, layer_modes, make_piece, pass_items
from simulator.cost.schedules import PipeOp, device_order
from simulator.specs import Job
from simulator.des.topology import Topology
from simulator.des.transfers import RoutedPhase, Transfers, copy_index
from simulator.cost.workload import layer_param_tensors, padded_vocab_size

OFFLOAD_SUBGROUPS = 4  # the offloaded optimizer step is pipelined over this many parameter sub-groups


@dataclass
class DesOptions:
    """Knobs of the DES. ``free_comm`` makes every transfer and collective instantaneous and
    ``skip_embedding_head`` drops the embedding and LM head (uniform stages): together they
    reproduce the textbook bubble (tests). ``blocking_p2p``: a rank's next pass waits until
    its pipeline send has completed (Megatron-LM's p2p helpers wait on the batched
    isend/irecv, as the analytic estimate assumes); False overlaps sends with compute
    (Megatron-core ``overlap_p2p_comm``). ``record_links`` keeps link-utilization series
    (``simulate_des(trace=True)`` turns it on)."""

    free_comm: bool = False
    skip_embedding_head: bool = False
    blocking_p2p: bool = True
    bucket_bytes: float = DP_BUCKET_BYTES
    record_links: bool = False


@dataclass
class Device:
    """One simulated GPU rank and its streams (lane name -> engine stream id)."""

    idx: int
    pp: int
    dp: int
    tp: int
    gpu: int
    node: int
    streams: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"stage {self.pp}" if (self.dp, self.tp) == (0, 0) else f"pp{self.pp} dp{self.dp} tp{self.tp}"


class ProgramBuilder:
    """Builds devices, tasks, transfers and memory changes of one iteration on ``engine``."""

    def __init__(self, job: Job, topo: Topology, engine: Engine, full: bool, options: DesOptions):
        self.job = job
        self.topo = topo
        self.eng = engine
        self.full = full
        self.opt = options
        plan = job.plan
        self.plan = plan
        self.p, self.t, self.d, self.v = plan.p, plan.t, plan.d, plan.v
        self.m = job.m
        self.chunks = plan.p * plan.v
        self.layers = plan.chunk_layers(job.model.num_layers)
        self.recompute = plan.chunk_recompute(job.model.num_layers)
        self.embed_head = not options.skip_embedding_head
        self.costs = Costs.of(job, options.free_comm)
        self.xfer = Transfers(topo, plan.p, plan.t, plan.d, full, options.free_comm)
        self.devices: list[Device] = []
        self.dev_at: dict[tuple[int, int, int], Device] = {}
        for pp in range(self.p):
            for dp in range(self.d if full else 1):
                for tp in range(self.t if full else 1):
                    gpu = rank_of(pp, dp, tp, self.t, self.d)
                    dev = Device(len(self.devices), pp, dp, tp, gpu, gpu // topo.gpus_per_node)
                    self.devices.append(dev)
                    self.dev_at[(pp, dp, tp)] = dev
        self.mem = MemoryTimeline(len(self.devices))
        self.counters: dict[str, float] = {"tp_bytes": 0.0, "tp_layer_allreduces": 0.0, "pp_bytes": 0.0,
                                           "dp_bytes": 0.0, "offload_bytes": 0.0}
        self.recomputed = {"full": 0, "selective": 0}  # layer passes recomputed by one pipeline replica
        self.lanes: dict[int, tuple[int, str]] = {}    # stream id -> (device idx, lane)
        self._piece_cache: dict[tuple, list[Piece]] = {}
        self._totals_cache: dict[tuple, tuple[float, int, int, int]] = {}
        self._pp_cache: dict[tuple[int, int], tuple[float, float]] = {}
        self._groups: dict[tuple, int] = {}
        self.first: dict[tuple[int, str, int, int], int] = {}
        self.last: dict[tuple[int, str, int, int], int] = {}
        self.dp_done: dict[int, list[int]] = {dev.idx: [] for dev in self.devices}
        self.pieces_of: dict[int, list[int]] = {}
        self.opt_last: dict[int, int] = {}
        self._piece_index: dict[int, tuple[int, int]] = {}  # compute task -> (device, index in pieces_of)
        self._gates: list[tuple[int, int]] = []             # (compute task, transfer it waits for)

    # ------------------------------------------------------------------ sizes

    def chunk_params(self, j: int) -> float:
        c = self.costs
        n = self.layers[j] * c.layer_params
        if self.embed_head and j == 0:
            n += c.emb_params
        if self.embed_head and j == self.chunks - 1:
            n += c.head_params
        return n

    def device_params(self, dev: Device) -> float:
        """Parameters held by one rank of dev's stage (all its chunks)."""
        return sum(self.chunk_params(c * self.p + dev.pp) for c in range(self.v))

    def device_layers(self, dev: Device) -> int:
        return sum(self.layers[c * self.p + dev.pp] for c in range(self.v))

    # ------------------------------------------------------------------ passes

    def pieces(self, kind: str, j: int, norec: bool, split: str) -> list[Piece]:
        """Compute tasks of one pass: the whole pass, one per gradient bucket, or one per layer."""
        key = (kind, j, norec, split)
        got = self._piece_cache.get(key)
        if got is None:
            items = self._items(kind, j, norec)
            if split == "layers":
                groups = [[i] for i in range(len(items))]
            elif split == "buckets":
                groups = bucket_groups(items, self.opt.bucket_bytes, self.costs.grad_bytes)
            else:
                groups = [list(range(len(items)))]
            got = [make_piece(kind, [items[i] for i in g]) for g in groups]
            self._piece_cache[key] = got
        return got

    def _items(self, kind: str, j: int, norec: bool):
        full, sel = self.recompute[j]
        modes = layer_modes(full, sel, self.layers[j], norec)
        return pass_items(self.costs, kind, modes, self.embed_head and j == 0, self.embed_head and j == self.chunks - 1)

    def _totals(self, kind: str, j: int, norec: bool) -> tuple[float, int, int, int]:
        """(TP bytes, layer TP all-reduces, layers fully / selectively recomputed) of a pass."""
        key = (kind, j, norec)
        got = self._totals_cache.get(key)
        if got is None:
            its = self._items(kind, j, norec)
            got = (sum(i.tp_bytes for i in its), sum(i.tp_layer_allreduces for i in its),
                   sum(i.rec_full for i in its), sum(i.rec_sel for i in its))
            self._totals_cache[key] = got
        return got

    def _norec(self, op: PipeOp) -> bool:
        """GPipe: the last microbatch's activations are still resident when its backward runs."""
        return self.plan.schedule == "gpipe" and op.mb == self.m - 1 and any(f + s for f, s in self.recompute)

    # ------------------------------------------------------------------ plumbing

    def stream(self, dev: Device, lane: str) -> int:
        s = dev.streams.get(lane)
        if s is None:
            s = self.eng.add_stream(f"{dev.name}/{lane}")
            dev.streams[lane] = s
            self.lanes[s] = (dev.idx, lane)
        return s

    def _transfer(self, dev: Device, lane: str, key: tuple, make: Callable[[], list[list[RoutedPhase]]], per: str,
                  size: float, kind: str, deps: tuple | list, label: str, counter: Optional[str],
                  mb: int = -1, chunk: int = -1) -> int:
        """An engine transfer of ``dev``'s copy of a class on ``dev``'s ``lane`` stream; its
        info is (device, microbatch, chunk, label)."""
        count_gpu = dev.gpu if (counter is not None and dev.idx == 0) else -1
        phases, sent = self.xfer.phases(key, make, copy_index(self.full, dev.dp, dev.tp, self.t, per), dev.gpu, size, count_gpu)
        if counter is not None:
            self.counters[counter] += sent
        return self.eng.transfer(self.stream(dev, lane), phases, kind, deps, (dev.idx, mb, chunk, label))

    def _group_task(self, dev: Device, key: tuple, dep: int, make: Callable[[], int]) -> int:
        """A data-parallel group's collective: created by its dp = 0 member, joined (as a
        dependency) by the other members in the full simulation."""
        gkey = (dev.pp, dev.tp) + key
        if dev.dp == 0:
            tid = make()
            self._groups[gkey] = tid
        else:
            tid = self._groups[gkey]
            self.eng.add_dep(tid, dep)
        return tid

    # ------------------------------------------------------------------ build

    def build(self) -> None:
        self._static_memory()
        orders = {dev.idx: device_order(self.plan.schedule, self.p, self.m, self.v, dev.pp) for dev in self.devices}
        self.orders = orders
        for dev in self.devices:
            self._compute(dev)
        for dev in self.devices:
            self._pipeline_sends(dev)
        self._embedding_sync()
        for dev in self.devices:
            self._optimizer(dev)
        self._param_allgather()
        self._sync_tensor_groups()

    def _gate(self, piece: int, transfer: int) -> None:
        """``piece`` waits for ``transfer`` (and, in the full simulation, so do the same
        pieces of its tensor-parallel peers: see :meth:`_sync_tensor_groups`)."""
        self.eng.add_dep(piece, transfer)
        self._gates.append((piece, transfer))

    def _sync_tensor_groups(self) -> None:
        """Full simulation: the TP collectives inside every pass (and the all-gather after a
        scattered pipeline send) make the t ranks of a group wait for each other, so a
        transfer that holds back one rank's pass holds back its peers' same pass. (TP
        collectives are closed-form segments, so this is added as dependencies; in the
        symmetric simulation the peers are copies and finish together by construction.)"""
        if not self.full or self.t == 1:
            return
        for piece, x in self._gates:
            didx, k = self._piece_index[piece]
            dev = self.devices[didx]
            for tp in range(self.t):
                if tp != dev.tp:
                    self.eng.add_dep(self.pieces_of[self.dev_at[(dev.pp, dev.dp, tp)].idx][k], x)

    def _static_memory(self) -> None:
        """Model states (ZeRO, offload), gradient buckets, pipeline send/receive buffers
        (as :func:`simulator.cost.stage.stage_memory`)."""
        plan, c = self.plan, self.costs
        model = self.job.model
        pipe_buffers = pipeline_buffer_bytes(plan.mb, model.seq_length, model.hidden_size, c.e, plan.p)
        for dev in self.devices:
            psi = self.device_params(dev)
            ms = model_state_bytes(psi, plan.d, plan.zero, plan.offload, c.param_bytes, c.grad_bytes, c.optimizer_bytes)
            self.mem.add_static(dev.idx, "params", ms.params)
            self.mem.add_static(dev.idx, "grads", ms.grads)
            self.mem.add_static(dev.idx, "optimizer", ms.optimizer)
            if plan.d > 1 or plan.offload != "none":
                self.mem.add_static(dev.idx, "buffers", gradient_bucket_bytes(psi, self.opt.bucket_bytes))
            if pipe_buffers:
                self.mem.add_static(dev.idx, "buffers", pipe_buffers)

    def _compute(self, dev: Device) -> None:
        eng, mem, plan = self.eng, self.mem, self.plan
        cs = self.stream(dev, "compute")
        order = self.orders[dev.idx]
        last_b: dict[int, int] = {}
        for k, op in enumerate(order):
            if op.kind == "B":
                last_b[op.chunk] = k
        zero3 = plan.zero == 3 and (plan.d > 1 or plan.offload != "none")  # offloaded params are fetched even at d = 1
        dp_sync = plan.d > 1 and plan.zero < 3
        overlap = dp_sync and self.job.runtime.dp_overlap
        per_mb = dp_sync and plan.zero == 2  # ZeRO-2 keeps a gradient shard: reduce every microbatch
        pieces: list[int] = []  # compute tasks in stream order (ZeRO-3 prefetch distance)
        self.pieces_of[dev.idx] = pieces
        count = dev.idx == 0
        rep = dev.dp == 0 and dev.tp == 0
        nred = 0
        for k, op in enumerate(order):
            j = op.chunk * self.p + dev.pp
            norec = self._norec(op)
            tp_bytes, tp_n, rec_f, rec_s = self._totals(op.kind, j, norec)
            if count:
                self.counters["tp_bytes"] += tp_bytes
                self.counters["tp_layer_allreduces"] += tp_n
            if rep:
                self.recomputed["full"] += rec_f
                self.recomputed["selective"] += rec_s
            bucketed = overlap and op.kind == "B" and (per_mb or last_b[op.chunk] == k)
            split = "layers" if zero3 else "buckets" if bucketed else "whole"
            for gi, pc in enumerate(self.pieces(op.kind, j, norec, split)):
                gather = self._zero3_gather(dev, pc.first_params, pieces) if zero3 else -1
                tid = eng.task(cs, pc.dur, op.kind, (), (dev.idx, op.mb, j, pc.segs))
                self._piece_index[tid] = (dev.idx, len(pieces))
                pieces.append(tid)
                if gather >= 0:
                    self._gate(tid, gather)
                if gather >= 0:
                    mem.add(tid, dev.idx, True, "buffers", -pc.first_params * self._pbytes())
                mem.add_many(tid, dev.idx, pc.start_mem, pc.end_mem)
                if gi == 0:
                    self.first[(dev.idx, op.kind, op.mb, j)] = tid
                self.last[(dev.idx, op.kind, op.mb, j)] = tid
                if zero3 and op.kind == "B":
                    self._zero3_reduce(dev, pc.first_params, tid, nred)
                    nred += 1
                elif bucketed:
                    self._reduce(dev, pc.params, tid, nred)
                    nred += 1
            if per_mb and not overlap and op.kind == "B":
                self._reduce(dev, self.chunk_params(j), pieces[-1], nred)
                nred += 1
        if dp_sync and not overlap and not per_mb:
            self._reduce(dev, self.device_params(dev), pieces[-1], nred)

    def _pbytes(self) -> int:
        """Bytes per parameter in parameter all-gathers: min(e, 2) (as the analytic)."""
        return min(self.costs.e, 2)

    # ZeRO-3 --------------------------------------------------------------------------

    def _zero3_gather(self, dev: Device, params: float, pieces: list[int]) -> int:
        """All-gather one layer's parameters, at most one layer ahead of the compute (with
        offload, this rank's shard first comes up from host memory, or NVMe then host)."""
        plan = self.plan
        dep = pieces[-2] if len(pieces) >= 2 else -1
        size = params * self._pbytes()
        shard = size / plan.d
        if plan.offload != "none":
            if plan.offload == "nvme":
                dep = self._transfer(dev, "nvme", ("nvme", dev.pp), self.xfer.host_class(dev.pp, "nvme"), "dptp", shard,
                                     "offload", (dep,), "param read", None)
            dep = self._transfer(dev, "h2d", ("h2d", dev.pp), self.xfer.host_class(dev.pp, "h2d"), "dptp", shard,
                                 "offload", (dep,), "param up", "offload_bytes")

        def make() -> int:
            return self._transfer(dev, "zero", ("ag", dev.pp), self.xfer.dp_class(dev.pp, "allgather"), "tp", size,
                                  "zero", (dep,), "param gather", "dp_bytes")

        g = self._group_task(dev, ("z3g", len(pieces)), dep, make)
        self.mem.add(g, dev.idx, False, "buffers", size)
        return g

    def _zero3_reduce(self, dev: Device, params: float, piece: int, n: int) -> None:
        size = params * self._pbytes()

        def make() -> int:
            return self._transfer(dev, "dp", ("rs", dev.pp), self.xfer.dp_class(dev.pp, "reducescatter"), "tp", size,
                                  "dp", (piece,), "grad reduce-scatter", "dp_bytes")

        rs = self._group_task(dev, ("red", n), piece, make)
        self.dp_done[dev.idx].append(self._grad_down(dev, rs, size))

    def _grad_down(self, dev: Device, reduced: int, size: float) -> int:
        """With offload, this rank's reduced gradient shard goes to host memory over PCIe."""
        if self.plan.offload == "none":
            return reduced
        return self._transfer(dev, "d2h", ("d2h", dev.pp), self.xfer.host_class(dev.pp, "d2h"), "dptp", size / self.plan.d,
                              "offload", (reduced,), "grad down", "offload_bytes")

    # ZeRO-0/1/2 ----------------------------------------------------------------------

    def _reduce(self, dev: Device, params: float, piece: int, n: int) -> None:
        """A gradient bucket's all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2)."""
        size = params * self.costs.grad_bytes
        op = "allreduce" if self.plan.zero == 0 else "reducescatter"

        def make() -> int:
            return self._transfer(dev, "dp", (op, dev.pp), self.xfer.dp_class(dev.pp, op), "tp", size, "dp", (piece,),
                                  f"grad {op}", "dp_bytes")

        red = self._group_task(dev, ("red", n), piece, make)
        self.dp_done[dev.idx].append(self._grad_down(dev, red, size))

    # pipeline ------------------------------------------------------------------------

    def _pp_size(self, s0: int, s1: int) -> tuple[float, float]:
        """(bytes each TP rank sends, extra seconds: the receivers' all-gather across nodes, or
        inside a node the wait of a receiver for a busy core) across one boundary."""
        got = self._pp_cache.get((s0, s1))
        if got is None:
            job, plan = self.job, self.plan
            S = plan.mb * job.model.seq_length * job.model.hidden_size * self.costs.e
            t = plan.t
            G = self.topo.gpus_per_node
            cross = self.xfer.gpu(s0, 0, 0) // G != self.xfer.gpu(s1, 0, 0) // G
            if cross and t > 1 and not plan.sp:
                got = (S / t, allgather_time(S, t, group_link(job.cluster, tp_shape(t, G))))
            else:   # inside a node a woken receiver waits for a busy core
                got = (S / t if plan.sp else S, 0.0 if cross else in_pass_wait(job.cluster))
            self._pp_cache[(s0, s1)] = got
        return got

    def _pipeline_sends(self, dev: Device) -> None:
        free = self.opt.free_comm
        order = self.orders[dev.idx]
        for k, op in enumerate(order):
            j = op.chunk * self.p + dev.pp
            nxt = j + 1 if op.kind == "F" else j - 1
            if nxt < 0 or nxt >= self.chunks:
                continue
            s1 = nxt % self.p
            size, tail = self._pp_size(dev.pp, s1)
            fwd = op.kind == "F"
            x = self._transfer(dev, "pp_fwd" if fwd else "pp_bwd", ("pp", dev.pp, s1),
                               self.xfer.p2p_class(dev.pp, s1, 0.0 if free else tail), "dptp", size, "pp",
                               (self.last[(dev.idx, op.kind, op.mb, j)],), "send activations" if fwd else "send gradients",
                               "pp_bytes", op.mb, j)
            rcv = self.dev_at[(s1, dev.dp, dev.tp)]
            self._gate(self.first[(rcv.idx, op.kind, op.mb, nxt)], x)
            if self.opt.blocking_p2p and k + 1 < len(order):
                after = order[k + 1]
                self._gate(self.first[(dev.idx, after.kind, after.mb, after.chunk * self.p + dev.pp)], x)

    def _embedding_sync(self) -> None:
        """Tied word embeddings: their gradient (padded V/t x h) is all-reduced between the
        first and the last stage after the data-parallel reduction (Megatron-LM)."""
        if not (self.embed_head and self.p > 1 and self.job.model.tie_embeddings):
            return
        model = self.job.model
        size = padded_vocab_size(model, self.t) / self.t * model.hidden_size * self.costs.e
        for dev in self.devices:
            if dev.pp != 0:
                continue
            other = self.dev_at[(self.p - 1, dev.dp, dev.tp)]
            deps = [self.pieces_of[dev.idx][-1], self.pieces_of[other.idx][-1]] + self.dp_done[dev.idx] + self.dp_done[other.idx]
            x = self._transfer(dev, "dp", ("emb",), self.xfer.pair_allreduce_class(0, self.p - 1), "dptp", size, "dp", deps,
                               "embedding all-reduce", "dp_bytes")
            self.dp_done[dev.idx].append(x)
            self.dp_done[other.idx].append(x)

    # optimizer -----------------------------------------------------------------------

    def _optimizer(self, dev: Device) -> None:
        """The step once every gradient of this rank has been reduced: mixed-precision Adam on
        the GPU (:func:`simulator.analytic.optimizer_time`), or (offload) on the host CPU with
        the NVMe state traffic around it."""
        plan = self.plan
        psi = self.device_params(dev)
        shard = psi / plan.d if plan.zero >= 1 else psi
        deps = self.dp_done[dev.idx] + [self.pieces_of[dev.idx][-1]]
        sync = 0.0 if self.opt.free_comm else step_sync_time(self.job)
        if sync > 0:  # the gradient-norm and loss scalar all-reduces (analytic.step_sync_time)
            deps = [self.eng.task(self.stream(dev, "dp"), sync, "dp", deps, (dev.idx, -1, -1, "norm and loss all-reduce"))]
        if plan.offload == "none":
            tensors = self.device_layers(dev) * layer_param_tensors(self.job.model) + 4
            dur = optimizer_time(self.job, shard, tensors)
            self.opt_last[dev.idx] = self.eng.task(self.stream(dev, "compute"), dur, "opt", deps,
                                                   (dev.idx, -1, -1, (("opt", dur),)))
            return
        # ZeRO-Offload/Infinity step in sub-groups, pipelined: (NVMe read) -> CPU Adam -> (NVMe
        # write) and the updated fp16 shard back up over PCIe (ZeRO-3: parameters stay on the host)
        k = OFFLOAD_SUBGROUPS
        state = shard * self.costs.optimizer_bytes / k
        ups: list[int] = []
        for i in range(k):
            pre = list(deps)
            if plan.offload == "nvme":
                pre.append(self._transfer(dev, "nvme", ("nvme", dev.pp), self.xfer.host_class(dev.pp, "nvme"), "dptp", state,
                                          "offload", deps, "optimizer state read", None))
            cpu = self._transfer(dev, "cpu", ("cpu", dev.pp), self.xfer.host_class(dev.pp, "cpu"), "dptp",
                                 shard * CPU_ADAM_STATE_BYTES / k, "cpu", pre, "CPU Adam", None)
            if plan.offload == "nvme":
                self._transfer(dev, "nvme_w", ("nvme", dev.pp), self.xfer.host_class(dev.pp, "nvme"), "dptp", state,
                               "offload", (cpu,), "optimizer state write", None)
            ups.append(cpu)
            if plan.zero < 3:
                ups[-1] = self._transfer(dev, "h2d", ("h2d", dev.pp), self.xfer.host_class(dev.pp, "h2d"), "dptp",
                                         shard * self._pbytes() / k, "offload", (cpu,), "params up", "offload_bytes")
        self.opt_last[dev.idx] = ups[-1]

    def _param_allgather(self) -> None:
        """ZeRO-1/2: all-gather the updated parameters once every member has stepped."""
        if self.plan.zero not in (1, 2) or self.plan.d == 1:
            return
        for dev in self.devices:
            size = self.device_params(dev) * self._pbytes()

            def make(dev: Device = dev, size: float = size) -> int:
                return self._transfer(dev, "dp", ("ag", dev.pp), self.xfer.dp_class(dev.pp, "allgather"), "tp", size, "dp",
                                      (self.opt_last[dev.idx],), "param all-gather", "dp_bytes")

            self._group_task(dev, ("pag",), self.opt_last[dev.idx], make)
