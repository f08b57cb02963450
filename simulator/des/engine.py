"""A lean, deterministic discrete-event engine: tasks with dependencies on FIFO streams.

* A *stream* runs its tasks one at a time in the order they were added, like a CUDA stream
  (a GPU has a compute stream and separate communication streams, so communication overlaps
  compute) or a host CPU queue.
* A *task* starts when it is at the head of its stream, the stream is idle, and all of its
  dependencies have finished. A task either has a fixed duration, or is a *transfer*: a
  sequence of phases, each a set of flows on the network (:mod:`simulator.des.network`) followed
  by a fixed latency (the collective's per-step latencies); the next phase starts when the
  previous one is over.
* Events are kept in a heap ordered by (time, sequence number): ties break in the order the
  events were created, so a run is exactly reproducible.
* A run always ends: tasks are finite, and every network event ends at least one flow (each
  flow's end falls within :func:`simulator.des.flow.finish_tolerance` of the time it was
  scheduled for) or is re-armed strictly later (:func:`_next_completion` checks it); a flow
  running alone on its links (:meth:`simulator.des.network.Network.add`) ends at its own event,
  or joins the others.

Task records are kept as flat lists (structure of arrays) indexed by task id; ``cause[t]`` is
the task whose completion let ``t`` start (its critical predecessor), which the result
builder walks to attribute waiting time.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simulator.des.flow import Flow
from simulator.des.network import Network

_FINISH, _PHASE_END, _NET, _ALONE_END = 0, 1, 2, 3


@dataclass(frozen=True)
class FlowSpec:
    """``nbytes`` over ``links``, standing for ``weights[i]`` identical flows on ``links[i]``."""

    links: tuple[int, ...]
    weights: tuple[float, ...]
    nbytes: float


@dataclass(frozen=True)
class Phase:
    """Flows that run together, then ``latency`` seconds (per-step latency terms)."""

    flows: tuple[FlowSpec, ...]
    latency: float


class Engine:
    """Streams, tasks and the event loop. Build with ``stream``/``task``/``transfer``, then ``run``."""

    def __init__(self, network: Network | None = None):
        self.net = network
        self.now = 0.0
        self.events = 0
        self._heap: list[tuple[float, int, int, int]] = []
        self._next_seq = itertools.count(1).__next__  # ties break in the order events were made
        # streams
        self.stream_name: list[str] = []
        self.stream_queue: list[list[int]] = []
        self._pos: list[int] = []
        self._busy: list[bool] = []
        # tasks
        self.stream: list[int] = []
        self.dur: list[float] = []
        self.kind: list[str] = []
        self.info: list[Any] = []
        self.start: list[float] = []
        self.end: list[float] = []
        self.cause: list[int] = []
        self._ndeps: list[int] = []
        self._succ: list[list[int]] = []
        self._phases: dict[int, Sequence[Phase]] = {}
        self._phase_idx: dict[int, int] = {}
        self._open_flows: dict[int, int] = {}
        self._alone: dict[int, Flow] = {}  # the flows running alone (Network.add), by their end event's key
        self._alone_key = itertools.count().__next__
        self._net_version = 0

    # ------------------------------------------------------------------ building

    def add_stream(self, name: str) -> int:
        self.stream_name.append(name)
        self.stream_queue.append([])
        self._pos.append(0)
        self._busy.append(False)
        return len(self.stream_name) - 1

    def task(
        self,
        stream: int,
        duration: float,
        kind: str,
        deps: Sequence[int] = (),
        info: Any = None,
        phases: Sequence[Phase] = (),
    ) -> int:
        """A task queued at the end of ``stream``: of a fixed ``duration``, or with ``phases`` a
        transfer (:meth:`transfer`)."""
        tid = len(self.stream)
        self.stream.append(stream)
        self.dur.append(duration)
        self.kind.append(kind)
        self.info.append(info)
        n = 0
        succ = self._succ
        for d in deps:
            if d >= 0:
                succ[d].append(tid)
                n += 1
        self._ndeps.append(n)
        succ.append([])
        self.stream_queue[stream].append(tid)
        if phases:
            self._phases[tid] = phases
        return tid

    def transfer(
        self, stream: int, phases: Sequence[Phase], kind: str, deps: Sequence[int] = (), info: Any = None
    ) -> int:
        """A task made of network phases; its duration is known only when it ends."""
        return self.task(stream, 0.0, kind, deps, info, phases)

    def add_dep(self, task: int, dep: int) -> None:
        """Make ``task`` wait for ``dep`` too (both already created, neither started)."""
        if dep >= 0:
            self._succ[dep].append(task)
            self._ndeps[task] += 1

    @property
    def num_tasks(self) -> int:
        return len(self.stream)

    # ------------------------------------------------------------------ running

    def _push(self, time: float, code: int, arg: int) -> None:
        heapq.heappush(self._heap, (time, self._next_seq(), code, arg))

    def _try_start(self, s: int, cause: int) -> None:
        if self._busy[s]:
            return
        q = self.stream_queue[s]
        pos = self._pos[s]
        if pos >= len(q):
            return
        tid = q[pos]
        if self._ndeps[tid]:
            return
        self._busy[s] = True
        now = self.now
        self.start[tid] = now
        self.cause[tid] = cause
        self.events += 1
        phases = self._phases.get(tid)
        if phases is None:
            heapq.heappush(self._heap, (now + self.dur[tid], self._next_seq(), _FINISH, tid))
        else:
            self._phase_idx[tid] = 0
            self._begin_phase(tid, phases[0])

    def _begin_phase(self, tid: int, phase: Phase) -> None:
        net = self.net
        n = 0
        now = self.now
        may_run_alone = len(phase.flows) == 1
        for fs in phase.flows:
            if fs.nbytes > 0.0 and fs.links:
                if net is None:
                    raise RuntimeError("a transfer needs a network")
                flow = Flow(fs.nbytes, fs.links, fs.weights, tid)
                end = net.add(flow, now, may_run_alone)
                if end is not None:  # alone on its links: the phase ends by its own event, unless another joins
                    key = self._alone_key()
                    self._alone[key] = flow
                    heapq.heappush(self._heap, (end + phase.latency, self._next_seq(), _ALONE_END, key))
                n += 1
        if n:
            self._open_flows[tid] = n
        else:
            heapq.heappush(self._heap, (now + phase.latency, self._next_seq(), _PHASE_END, tid))

    def _phase_end(self, tid: int) -> None:
        phases = self._phases[tid]
        i = self._phase_idx[tid] + 1
        if i < len(phases):
            self._phase_idx[tid] = i
            self._begin_phase(tid, phases[i])
        else:
            self._finish(tid)

    def _finish(self, tid: int) -> None:
        now = self.now
        self.end[tid] = now
        self.dur[tid] = now - self.start[tid]
        self.events += 1
        s = self.stream[tid]
        nd, stream, queue, pos, busy = self._ndeps, self.stream, self.stream_queue, self._pos, self._busy
        busy[s] = False
        pos[s] += 1
        for v in self._succ[tid]:
            nd[v] -= 1
            if nd[v] == 0:
                sv = stream[v]
                # start v only if it heads its idle stream (_try_start's test, inlined)
                if not busy[sv] and queue[sv][pos[sv]] == v:
                    self._try_start(sv, tid)
        q, head = queue[s], pos[s]
        if head < len(q) and not busy[s] and not nd[q[head]]:  # the stream's next task, ready
            self._try_start(s, tid)

    def _flows_done(self, owners: Sequence[int], time: float) -> None:
        """One flow of each of ``owners`` ended at ``time``: a phase whose last flow it was
        ends after its latency."""
        open_flows = self._open_flows
        for owner in owners:
            left = open_flows[owner] - 1
            if left:
                open_flows[owner] = left
            else:
                del open_flows[owner]
                lat = self._phases[owner][self._phase_idx[owner]].latency
                heapq.heappush(self._heap, (time + lat, self._next_seq(), _PHASE_END, owner))

    def run(self) -> float:
        """Run to completion; returns the time the last task ended."""
        n = len(self.stream)  # the tasks' records of a run, made at once (tasks are added before it)
        self.start, self.end, self.cause = [-1.0] * n, [-1.0] * n, [-1] * n
        for s in range(len(self.stream_name)):
            self._try_start(s, -1)
        heap = self._heap
        net = self.net if self.net is not None else Network([])
        pop = heapq.heappop
        while True:
            if net is not None and net.dirty and (not heap or heap[0][0] > self.now):
                self._net_version += 1
                nxt = net.allocate(self.now)
                if net.flows:
                    self._push(nxt, _NET, self._net_version)
            if not heap:
                break
            time, _, code, arg = pop(heap)
            self.now = time
            if code == _FINISH:
                self._finish(arg)
            elif code == _PHASE_END:
                self.events += 1
                self._phase_end(arg)
            elif code == _ALONE_END:  # a phase whose only flow ran alone: over, its latency after that flow
                flow = self._alone.pop(arg)
                if flow.lone:  # else another flow joined it: the network ends it
                    net.leave(flow)
                    self.events += 1
                    del self._open_flows[flow.owner]
                    self._phase_end(flow.owner)
            else:
                if arg != self._net_version:
                    continue
                self.events += 1
                self._flows_done(net.pop_finished(time), time)
                if not net.dirty and net.flows:
                    # no flow ended at its completion time (finish_tolerance rules it out): re-arm
                    self._net_version += 1
                    self._push(_next_completion(net, time), _NET, self._net_version)
        unfinished = [t for t, e in enumerate(self.end) if e < 0] if min(self.end, default=0.0) < 0 else []
        if unfinished:
            t = unfinished[0]
            raise RuntimeError(
                f"deadlock: {len(unfinished)} tasks never ran, e.g. {self.kind[t]} {self.info[t]!r} "
                f"on {self.stream_name[self.stream[t]]}"
            )
        return max(self.end, default=0.0)


def _next_completion(net: Network, now: float) -> float:
    """The network's next completion time, which must lie after ``now``: a network event that
    ends no flow and is re-armed at the same instant would repeat forever (the simulated clock
    stops where ``now + rem / rate`` rounds back to ``now``; :func:`simulator.des.flow.finish_tolerance`
    ends such flows, so this is a guard)."""
    nxt = net.allocate(now)
    if not nxt > now:
        raise RuntimeError(
            f"DES made no progress at t = {now!r} s: {len(net.flows)} flows in flight, none can finish "
            f"(rates {sorted({f.rate for f in net.flows})[:4]})"
        )
    return nxt
