"""Pipeline sends between stages, and the tensor-parallel peers' shared waits.

One network transfer per boundary and microbatch on the sender's PP stream (forward and
backward directions on separate streams) of what :func:`simulator.cost.step.pipeline_send`
says one TP rank sends; the receiver's pass waits for it, and (``DesOptions.blocking_p2p``,
Megatron-LM) so does the sender's next pass.
"""

from __future__ import annotations

from simulator.cost.boundary import boundary_activation_bytes
from simulator.cost.schedules import chunk_rank
from simulator.cost.step import pipeline_send
from simulator.des.program.state import Device, PreparedTransfer, Program, Send


def boundary_send(prog: Program, s0: int, s1: int) -> tuple[float, float]:
    """(bytes each TP rank sends, extra seconds) from stage ``s0`` to ``s1`` (cached)."""
    key = ("pp-size", s0, s1)
    got = prog.cache.get(key)
    if got is None:
        job, plan = prog.job, prog.plan
        act = boundary_activation_bytes(job.model, plan.mb, prog.costs.e)
        gpn = prog.topo.gpus_per_node
        crosses = prog.xfer.gpu(s0, 0, 0) // gpn != prog.xfer.gpu(s1, 0, 0) // gpn
        got = pipeline_send(job.cluster, plan, act, crosses)
        prog.cache[key] = got
    return got


def _boundary(prog: Program, s0: int, s1: int, fwd: bool) -> Send:
    """The send from stage ``s0`` to ``s1`` (activations forward, gradients backward; cached:
    every microbatch sends the same)."""
    key = (s0, s1, fwd)
    got = prog.boundary_sends.get(key)
    if got is None:
        size, tail = boundary_send(prog, s0, s1)
        cls = prog.xfer.p2p_class(s0, s1, 0.0 if prog.opt.free_comm else tail)
        label = "send activations" if fwd else "send gradients"
        got = Send("pp_fwd" if fwd else "pp_bwd", cls, "dptp", size, "pp", label, "pp_bytes")
        prog.boundary_sends[key] = got
    return got


def add_sends(prog: Program, dev: Device) -> None:
    """Every pipeline send of ``dev``, gating the receiver's pass (and the sender's next)."""
    order = prog.orders[dev.idx]
    routes: dict[tuple[str, int], tuple[int, int, int, PreparedTransfer | None] | None] = {}
    di, first, last = dev.idx, prog.first, prog.last
    chunk = [prog.chunk_of(dev, c) for c in range(prog.v)]  # each local chunk's model-order index
    gate, start, add_dep = prog.gate, prog.start_transfer, prog.eng.add_dep
    blocking = prog.opt.blocking_p2p
    for k, (kind, mb, local) in enumerate(order):
        if kind == "W":  # ZB-H1's weight gradients stay on the rank
            continue
        key = (kind, local)
        if key not in routes:  # made at its first use: the streams are created in the order the sends run
            routes[key] = _route(prog, dev, kind, local)
        route = routes[key]
        if route is None:  # the model's first or last chunk
            continue
        j, nxt, rcv, send = route
        if send is None:  # ZB-V's turn: the next chunk is this rank's other one, no send
            add_dep(first[(di, kind, mb, nxt)], last[(di, kind, mb, j)])
            continue
        x = start(send, (last[(di, kind, mb, j)],), mb, j)
        gate(first[(rcv, kind, mb, nxt)], x)
        if blocking and k + 1 < len(order):
            after = order[k + 1]
            gate(first[(di, after.kind, after.mb, chunk[after.chunk])], x)


def _route(prog: Program, dev: Device, kind: str, local: int) -> tuple[int, int, int, PreparedTransfer | None] | None:
    """Where ``dev``'s ``kind`` pass of its ``local`` chunk sends (the same for every
    microbatch): (its chunk, the next chunk, the receiving device, the prepared send, None when
    the next chunk is on this rank), or None when no chunk follows."""
    j = prog.chunk_of(dev, local)
    nxt = j + 1 if kind == "F" else j - 1
    if nxt < 0 or nxt >= prog.chunks:
        return None
    s1 = chunk_rank(prog.plan.schedule, nxt, prog.p)
    if s1 == dev.pp:
        return j, nxt, dev.idx, None
    rcv = prog.dev_at[(s1, dev.dp, dev.tp)]
    return j, nxt, rcv.idx, prog.prepare_transfer(dev, _boundary(prog, dev.pp, s1, kind == "F"))


def sync_tensor_groups(prog: Program) -> None:
    """Full simulation: the TP collectives inside every pass (and the all-gather after a
    scattered pipeline send) make the t ranks of a group wait for each other, so a transfer
    that holds back one rank's pass holds back its peers' same pass. (TP collectives are
    closed-form segments, so this is added as dependencies; in the symmetric simulation the
    peers are copies and finish together by construction.)"""
    if not prog.full or prog.t == 1:
        return
    for piece, x in prog.gates:
        didx, k = prog.piece_index[piece]
        dev = prog.devices[didx]
        for tp in range(prog.t):
            if tp != dev.tp:
                prog.eng.add_dep(prog.pieces_of[prog.dev_at[(dev.pp, dev.dp, tp)].idx][k], x)
