"""The program under construction: its devices, streams, typed task records and plumbing.

:class:`Program` holds what the builders of :mod:`simulator.des.program` share: the simulated
devices, the per-pass compute pieces (:mod:`simulator.des.passes`), the transfer classes
(:mod:`simulator.des.transfers`), the memory timeline and the bookkeeping that later parts of
the step depend on (the first and last task of each pass, each rank's reductions).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from simulator.cost import collectives
from simulator.cost.block_times import busy_ranks, synchronous_op_seconds
from simulator.cost.layout import rank_of
from simulator.cost.memory import bucket_bytes_of
from simulator.cost.schedules import PipeOp, global_chunk
from simulator.cost.zero3 import ShardLinks, shard_links
from simulator.des.engine import Engine, Phase
from simulator.des.memtimeline import MemoryTimeline
from simulator.des.passes import Costs, Item, Piece, Segments, bucket_groups, layer_modes, make_piece, pass_items
from simulator.des.topology import Topology
from simulator.des.transfers import TransferClass, Transfers, copy_index
from simulator.job import Job

Split = Literal["whole", "buckets", "layers"]
# one copy of a transfer class per tensor rank, per (dp, tp) rank, or per hybrid-sharding
# (shard group, tp) / (replicate group, tp)
CopyPer = Literal["tp", "dptp", "shard", "replica"]


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
    bucket_bytes: float | None = (
        None  # the gradient buckets; None: the runtime's (simulator.cost.memory.bucket_bytes_of)
    )
    record_links: bool = False


class TaskInfo(NamedTuple):
    """What an engine task stands for (the trace, plot and attribution read it)."""

    device: int  # index of the simulated rank in Program.devices
    microbatch: int = -1  # -1 outside a pass
    chunk: int = -1  # pipeline chunk (model order), -1 outside a pass
    label: str = ""  # transfers and step-end tasks: what they do
    segments: Segments = ()  # compute tasks: (segment kind, seconds) in execution order


#: TaskInfo from its five fields at C speed (NamedTuple's keyword-taking constructor is a Python
#: function; the builders make one per task, tens of thousands per iteration)
pass_info = functools.partial(tuple.__new__, TaskInfo)


@dataclass(frozen=True)
class Send:
    """One transfer a device makes: a copy of the transfer class ``cls`` of ``size`` bytes on
    the device's ``lane`` stream, counted under ``counter``."""

    lane: str
    cls: TransferClass
    per: CopyPer
    size: float
    kind: str
    label: str
    counter: str | None = None


class PreparedTransfer(NamedTuple):
    """A device's copy of a transfer class at one size, ready to start (Program.prepare_transfer)."""

    device: int
    stream: int
    phases: list[Phase]
    kind: str
    label: str
    counter: str | None
    sent: float  # bytes the counted rank sends in it


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


class Program:
    """The devices and shared bookkeeping of one iteration being built on ``engine``."""

    def __init__(self, job: Job, topo: Topology, engine: Engine, full: bool, options: DesOptions):
        plan = job.plan
        self.job, self.topo, self.eng, self.full, self.opt = job, topo, engine, full, options
        self.bucket_bytes = (
            bucket_bytes_of(job.runtime, job.plan.d) if options.bucket_bytes is None else options.bucket_bytes
        )
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
        self.counters: dict[str, float] = {
            "tp_bytes": 0.0,
            "tp_layer_all_reduces": 0.0,
            "pp_bytes": 0.0,
            "dp_bytes": 0.0,
            "offload_bytes": 0.0,
        }
        self.recomputed = {"full": 0, "selective": 0}  # layer passes recomputed by one pipeline replica
        self.lanes: dict[int, tuple[int, str]] = {}  # stream id -> (device idx, lane)
        self.orders: dict[int, list[PipeOp]] = {}  # device idx -> its passes in schedule order
        self.first: dict[tuple[int, str, int, int], int] = {}  # (device, kind, mb, chunk) -> first task
        self.last: dict[tuple[int, str, int, int], int] = {}  # ... -> last task
        self.dp_done: dict[int, list[int]] = {dev.idx: [] for dev in self.devices}  # reductions the step waits for
        self.pieces_of: dict[int, list[int]] = {}  # device idx -> compute tasks in stream order
        self.opt_last: dict[int, int] = {}  # device idx -> last task of its optimizer step
        # compute task -> (device, index in pieces_of): the full simulation's (pipeline.sync_tensor_groups)
        self.piece_index: dict[int, tuple[int, int]] = {}
        self.gates: list[tuple[int, int]] = []  # (compute task, transfer it waits for): the full simulation's
        self.serial_waits: dict[int, int] = {}  # device idx -> a reduction its next compute task waits for
        self._piece_cache: dict[tuple, list[Piece]] = {}
        self._totals_cache: dict[tuple, tuple[float, float, int, int]] = {}
        self._groups: dict[tuple, int] = {}
        self.cache: dict[tuple, tuple[float, float]] = {}  # per-boundary send sizes (pipeline.boundary_send)
        self.boundary_sends: dict[tuple[int, int, bool], Send] = {}  # per boundary and direction (pipeline._boundary)

    # ------------------------------------------------------------------ sizes

    @functools.cached_property
    def dp_link(self) -> collectives.GroupLink:
        """The data-parallel group's link (closed form, for contention prices)."""
        return collectives.dp_link(self.job.cluster, self.plan.t, self.plan.d)

    @functools.cached_property
    def host_op_s(self) -> float | None:
        """The per-op host seconds FSDP2's hooks take on a synchronous (CPU) rank, the node's
        cores shared by the ranks computing at once (simulator.cost.block_times.
        synchronous_op_seconds, busy_ranks); None on a GPU."""
        job = self.job
        return synchronous_op_seconds(job.cluster, busy_ranks(job.cluster, job.plan, job.m))

    @functools.cached_property
    def shard_links(self) -> ShardLinks:
        """The sharded states' shard (and replicate) groups (simulator.cost.zero3.shard_links)."""
        return shard_links(self.job.cluster, self.plan, self.job.runtime.scatter_gather)

    def chunk_params(self, j: int) -> float:
        """Parameters of chunk ``j`` on one rank (its layers, plus the embedding / head)."""
        c = self.costs
        n = self.layers[j] * c.layer_params
        if self.embed_head and j == 0:
            n += c.emb_params
        if self.embed_head and j == self.chunks - 1:
            n += c.head_params
        return n

    def device_params(self, dev: Device) -> float:
        """Parameters held by one rank of dev's stage (all its chunks)."""
        return sum(self.chunk_params(j) for j in self.device_chunks(dev))

    def device_sharded_params(self, dev: Device) -> float:
        """The parameters whose states ZeRO shards, for one rank of dev's stage
        (simulator.cost.stage_memory.StageShape.sharded_params)."""
        return self.device_params(dev) + self.device_layers(dev) * self.costs.layer_sharded_extra

    def device_layers(self, dev: Device) -> int:
        return sum(self.layers[j] for j in self.device_chunks(dev))

    def device_chunks(self, dev: Device) -> list[int]:
        """The model-order chunks dev's stage runs, in local chunk order (simulator.cost.schedules)."""
        return [self.chunk_of(dev, c) for c in range(self.v)]

    def chunk_of(self, dev: Device, local: int) -> int:
        """The model-order chunk dev's stage runs as its ``local`` chunk."""
        return global_chunk(self.plan.schedule, local, dev.pp, self.p)

    # ------------------------------------------------------------------ passes

    def pieces(self, kind: str, j: int, norec: bool, split: Split) -> list[Piece]:
        """Compute tasks of one pass: the whole pass, one per gradient bucket, or one per layer."""
        key = (kind, j, norec, split)
        got = self._piece_cache.get(key)
        if got is None:
            items = self._items(kind, j, norec)
            if split == "layers":
                groups = [[i] for i in range(len(items))]
            elif split == "buckets":
                groups = bucket_groups(items, self.bucket_bytes, self.costs.grad_bytes)
            else:
                groups = [list(range(len(items)))]
            got = [make_piece(kind, [items[i] for i in g]) for g in groups]
            self._piece_cache[key] = got
        return got

    def _items(self, kind: str, j: int, norec: bool) -> list[Item]:
        full, sel = self.recompute[j]
        modes = layer_modes(full, sel, self.layers[j], norec)
        first, last = self.embed_head and j == 0, self.embed_head and j == self.chunks - 1
        return pass_items(self.costs, kind, modes, first, last, self.plan.split_backward)

    def totals(self, kind: str, j: int, norec: bool) -> tuple[float, float, int, int]:
        """(TP bytes, layer TP all-reduces, layers fully / selectively recomputed) of a pass."""
        key = (kind, j, norec)
        got = self._totals_cache.get(key)
        if got is None:
            its = self._items(kind, j, norec)
            got = (
                sum(i.tp_bytes for i in its),
                sum(i.tp_layer_all_reduces for i in its),
                sum(i.rec_full for i in its),
                sum(i.rec_sel for i in its),
            )
            self._totals_cache[key] = got
        return got

    @functools.cached_property
    def norec_mb(self) -> int:
        """The microbatch whose backward recomputes nothing: GPipe's last, whose activations are
        still resident when its backward runs (-1: none)."""
        if self.plan.schedule == "gpipe" and any(f + s for f, s in self.recompute):
            return self.m - 1
        return -1

    # ------------------------------------------------------------------ plumbing

    def stream(self, dev: Device, lane: str) -> int:
        """The engine stream of ``dev``'s ``lane`` (created on first use)."""
        s = dev.streams.get(lane)
        if s is None:
            s = self.eng.add_stream(f"{dev.name}/{lane}")
            dev.streams[lane] = s
            self.lanes[s] = (dev.idx, lane)
        return s

    def transfer(
        self, dev: Device, send: Send, deps: tuple[int, ...] | list[int], mb: int = -1, chunk: int = -1
    ) -> int:
        """An engine transfer of ``dev``'s copy of ``send``'s class on its lane's stream."""
        return self.start_transfer(self.prepare_transfer(dev, send), deps, mb, chunk)

    def prepare_transfer(self, dev: Device, send: Send) -> PreparedTransfer:
        """What every transfer of ``dev``'s copy of ``send`` shares (a pipeline boundary sends one
        per microbatch)."""
        count_gpu = dev.gpu if (send.counter is not None and dev.idx == 0) else -1
        copy = copy_index(self.full, dev.dp, dev.tp, self.t, send.per, self.plan.shard_group)
        phases, sent = self.xfer.phases(send.cls, copy, dev.gpu, send.size, count_gpu)
        return PreparedTransfer(dev.idx, self.stream(dev, send.lane), phases, send.kind, send.label, send.counter, sent)

    def start_transfer(
        self, x: PreparedTransfer, deps: tuple[int, ...] | list[int], mb: int = -1, chunk: int = -1
    ) -> int:
        """An engine transfer of a prepared send (counted under its counter)."""
        if x.counter is not None:
            self.counters[x.counter] += x.sent
        return self.eng.task(x.stream, 0.0, x.kind, deps, pass_info((x.device, mb, chunk, x.label, ())), x.phases)

    def group_task(
        self, dev: Device, key: tuple, dep: int, make: Callable[[], int], member: tuple[int, int] | None = None
    ) -> int:
        """A data-parallel group's collective: created by its first member, joined (as a
        dependency) by the other members in the full simulation. ``member``: (the rank's index
        in its group, the group's id) for a group smaller than the data-parallel group (hybrid
        sharding); default (dp, 0)."""
        idx, gid = member if member is not None else (dev.dp, 0)
        gkey = (dev.pp, dev.tp, gid, *key)
        if idx == 0:
            tid = make()
            self._groups[gkey] = tid
        else:
            tid = self._groups[gkey]
            self.eng.add_dep(tid, dep)
        return tid

    def gate(self, piece: int, transfer: int) -> None:
        """``piece`` waits for ``transfer`` (and, in the full simulation, so do the same
        pieces of its tensor-parallel peers: pipeline.sync_tensor_groups)."""
        self.eng.add_dep(piece, transfer)
        if self.full:  # the symmetric simulation's peers are copies: nothing to sync
            self.gates.append((piece, transfer))
