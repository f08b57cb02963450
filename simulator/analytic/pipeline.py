"""Closed forms of the pipeline: its time, its point-to-point sends, the tied embedding.

    GPipe / 1F1B:  T_pipe = (m - 1) * max_i c_i + sum_i c_i
    interleaved:   T_pipe = m * max_i c_i + (sum_i c_i - max_i c_i) / v
    ZB-H1:         T_pipe = m * max_i c_i + sum_{i != crit} (c_i - w_i - min(w_i, f_i)), w_i the W part,
                   f_i the forward: (p - 1)(B + max(0, F - W)) for equal stages
    ZB-V:          T_pipe = m * max_i c_i + sum_{i != crit} (c_i - w_i - f_i) / 2: (p - 1) B / 2
which for equal stages gives a bubble of (p - 1)/m (resp. (p - 1)/(v m)) of the ideal m * c
(Narayanan et al. 2021, section 2.2). What a boundary send moves is
simulator.cost.step.pipeline_send's; the link is the one between two stages.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hwprofiles.algorithms import uses_trees
from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, layout
from simulator.cost.boundary import boundary_activation_bytes
from simulator.cost.cache import IdentityCache
from simulator.cost.ops import dtype_bytes
from simulator.cost.step import pipeline_send, tied_embedding_bytes
from simulator.job import Job
from simulator.numeric import maximum, minimum, where
from simulator.plan import Plan
from simulator.specs import ModelSpec

_P2P = IdentityCache(4096)
_TIED = IdentityCache(4096)


class ScheduleKind(NamedTuple):
    """What the pipeline's closed forms read of a plan's schedule (module docstring): booleans
    for one plan, arrays for many (the batch estimate)."""

    interleaved: Any  # interleaved with v > 1
    zbh1: Any
    zbv: Any
    gpipe_kept: Any  # GPipe with m > 1: the last microbatch's recomputation is skipped

    @staticmethod
    def of(schedule: str, v: int, m: int = 1) -> ScheduleKind:
        """The kind of one plan's ``schedule``."""
        return ScheduleKind.from_flags(
            schedule == "interleaved", schedule == "zbh1", schedule == "zbv", schedule == "gpipe", v, m
        )

    @staticmethod
    def from_flags(interleaved: Any, zbh1: Any, zbv: Any, gpipe: Any, v: Any, m: Any) -> ScheduleKind:
        """The kind from which schedule each plan runs (booleans, or arrays of them): interleaving
        matters with v > 1 chunks, GPipe's kept last microbatch with m > 1 microbatches."""
        return ScheduleKind(interleaved & (v > 1), zbh1, zbv, gpipe & (m > 1))


def skipped_recompute(kind: ScheduleKind, recompute: Any) -> Any:
    """The recomputation of the critical device (``recompute`` per microbatch) that GPipe skips
    for the last microbatch, whose activations are still resident when its backward runs; 0 for
    the other schedules and with one microbatch. Numbers or arrays alike."""
    return where(kind.gpipe_kept, recompute, 0.0)


def steady_seconds(m: Any, worst: Any, saved: Any) -> Any:
    """The critical device's own work in a step: m microbatches at ``worst`` seconds each, less the
    recomputation GPipe skips for the last one (``saved``). Numbers or arrays alike."""
    return m * worst - saved


def p2p_sends(p: Any, v: Any, first: Any, last: Any, turn: Any) -> Any:
    """Blocking pipeline sends of one device per microbatch: each of its v chunks sends the
    forward activation on and the backward gradient back, except that the model's first
    chunk sends no gradient and its last chunk no activation, and that ZB-V's turn (chunks p-1
    and p on the last rank, ``turn``) passes both on inside the rank. Numbers or arrays alike."""
    return where(p == 1, 0, 2 * v - first - last - 2 * turn)


def stage_microbatch(total: Any, weight_casts: Any, sends: Any, p2p: Any, sharded: Any) -> Any:
    """One stage's seconds per microbatch (c_i of the module docstring): its passes and in-pass
    collectives (StageCost.total), the fp8 weight casts where the program does not cache them,
    its blocking pipeline sends and its exposed sharded-state traffic. Numbers or arrays alike."""
    return total + weight_casts + sends * p2p + sharded


def p2p_exposed(job: Job) -> float:
    """Seconds of one pipeline send of ``job``'s plan (:func:`p2p_seconds`)."""
    plan = job.plan
    return p2p_seconds(job.model, job.cluster, plan.t, plan.sp, plan.mb, plan.p, plan.d)


def p2p_seconds(model: ModelSpec, cluster: ClusterSpec, t: int, sp: int, mb: int, p: int, d: int) -> float:
    """Seconds of one pipeline send (:func:`_p2p_time`) of a plan with these fields; 0 with one
    stage. It depends on the plan through t, sp, mb and whether a stage boundary crosses nodes,
    and on the cluster through its node and network alone: cached per model, node and network
    (every size of a sweep holds the same ones: hwprofiles.load.with_nodes)."""
    if p == 1:
        return 0.0
    crosses = layout.pp_crosses_nodes(t, p, d, cluster.gpus_per_node)
    return _P2P.get_or_make(
        (model, cluster.node, cluster.network),
        (t, bool(sp), mb, crosses),
        lambda: _p2p_time(model, cluster, Plan(t=t, sp=sp, mb=mb, p=p, d=d)),
    )


def _pipeline_link(cluster: ClusterSpec, plan: Plan) -> tuple[float, float, bool]:
    """(bytes/s, latency, crosses nodes) of the link joining two pipeline stages: a GPU's share
    of its node's NICs when some stage boundary crosses nodes, else send/recv's figures inside
    the node."""
    node = cluster.node
    gpn = cluster.gpus_per_node
    if layout.pp_crosses_nodes(plan.t, plan.p, plan.d, gpn) and node.nic is not None and node.nics_per_node:
        return node.nic.bytes_per_s * min(1.0, node.nics_per_node / gpn), node.nic.latency_s, True
    return (*node.intra_figures("send_recv"), False)


def _p2p_time(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> float:
    """Seconds of one pipeline send (b*s*h elements). With t > 1 across nodes each TP rank
    sends b*s*h/t over its own NIC and the receivers all-gather over NVLink (Megatron's
    scatter/gather optimization, Narayanan et al. 2021, section 4.1). Inside a node the
    receiver may wait for a busy core (collectives.in_pass_wait)."""
    act = boundary_activation_bytes(model, plan.mb, dtype_bytes(cluster.gpu))
    bw, lat, crosses = _pipeline_link(cluster, plan)
    size, extra = pipeline_send(cluster, plan, act, crosses)
    return collectives.p2p_time(size, bw, lat) + extra


def weight_fill(zbv: Any, backward_weight: Any, forward: Any) -> Any:
    """What a device's passes take out of the zero-bubble schedules' bubble per microbatch. The
    critical device idles while the first microbatch's input gradients come back through the
    others: their B's, which no W can fill (its own first W follows its first B). ZB-H1's W's fill
    the rest up to a forward's worth, w + min(w, f): torch's order replayed gives
    (p - 1)(B + max(0, F - W)) for equal stages (Qi et al. 2024's (p - 1)(F + B - W) is the case
    W <= F). ZB-V's (``zbv``) V fills all of it, w + f: (p - 1) B / 2 once halved (its chunks are
    half a device), replayed exactly while F and W are at most B, the regime of transformer layers
    (tests/test_zero_bubble.py replays both orders). Numbers or arrays alike."""
    return backward_weight + where(zbv, forward, minimum(backward_weight, forward))


def pipeline_bubble(
    worst: Any, total: Any, kind: ScheduleKind, v: Any, worst_fill: Any = 0.0, total_fill: Any = 0.0
) -> Any:
    """T_pipe - m * worst: the critical device's idle time, (sum_i c_i - max_i c_i), divided
    by v when interleaved; never negative (the sum includes the maximum). The zero-bubble
    schedules fill it: :func:`weight_fill` of each other device (``worst_fill`` / ``total_fill``:
    of the critical device and of all of them, counted per device), at least 0; ZB-V's is halved,
    its chunks being half a device's layers (Qi et al. 2024, section 6). Numbers or arrays alike."""
    idle = total - worst
    zero_bubble = maximum(0.0, idle - (total_fill - worst_fill))
    return where(kind.interleaved, idle / v, where(kind.zbv, zero_bubble / 2, where(kind.zbh1, zero_bubble, idle)))


def pipeline_floor(m: Any, worst: Any, total: Any, kind: ScheduleKind, v: Any, recompute: Any) -> Any:
    """A floor under the pipeline time of stages whose seconds per microbatch are at least these
    (``worst``: the largest, ``total``: their sum over devices; ``recompute``: the most
    recomputation of any of them):

        floor = m * worst - [GPipe, m > 1] recompute + bubble,
        bubble = (total - worst) / v interleaved, (total - worst) for GPipe and 1F1B, 0 for ZB-H1 and ZB-V.

    Adding d_i >= 0 to each stage's c_i never lowers max_i c_i nor sum_i c_i - max_i c_i (the sum
    gains every d_i, at least once each, the maximum at most the largest), so steady_seconds + pipeline_bubble
    of the larger stages is at least this; the zero-bubble schedules' bubble is at least 0, and
    GPipe skips at most the largest recomputation. Numbers or arrays alike."""
    idle = total - worst
    bubble = where(kind.interleaved, idle / v, where(kind.zbh1 | kind.zbv, 0.0, idle))
    return m * worst - where(kind.gpipe_kept, recompute, 0.0) + bubble


def pipeline_time(worst: Any, total: Any, m: Any, kind: ScheduleKind, v: Any) -> Any:
    """``worst``: the slowest device's time per microbatch; ``total``: the sum over devices."""
    return m * worst + pipeline_bubble(worst, total, kind, v)


def tied_embedding_time(job: Job) -> float:
    """All-reduce of the word-embedding gradient (V/t x h, e bytes; V padded) between the first
    and the last pipeline stage when p > 1 and the embeddings are tied: a 2-rank all-reduce
    (S/B) over NVLink inside a node, else over the node's NICs shared by all its GPUs (every
    TP/DP rank of the two stages does it at once). Cached per (model, cluster, t, p, d)."""
    model, cluster, plan = job.model, job.cluster, job.plan
    if plan.p == 1 or not model.tie_embeddings:
        return 0.0
    return _TIED.get_or_make((model, cluster), (plan.t, plan.p, plan.d), lambda: _tied_all_reduce(model, cluster, plan))


def _tied_all_reduce(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> float:
    size = tied_embedding_bytes(model, plan.t, dtype_bytes(cluster.gpu))
    bw, lat, crosses = _pipeline_link(cluster, plan)
    link = (
        collectives.GroupLink(bw, lat, uses_trees(cluster.node.backend)) if crosses else collectives.node_link(cluster)
    )
    return collectives.all_reduce_time(size, 2, link)
