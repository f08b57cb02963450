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

from hwprofiles.algorithms import uses_trees
from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, layout
from simulator.cost.cache import IdentityCache
from simulator.cost.ops import dtype_bytes
from simulator.cost.stage import block_times
from simulator.cost.step import pipeline_send, tied_embedding_bytes
from simulator.job import Job
from simulator.plan import ZERO_BUBBLE_SCHEDULES, Plan
from simulator.specs import ModelSpec

_P2P = IdentityCache(4096)
_TIED = IdentityCache(4096)


def p2p_sends(plan: Plan, first: bool, last: bool, turn: bool = False) -> int:
    """Blocking pipeline sends of one device per microbatch: each of its v chunks sends the
    forward activation on and the backward gradient back, except that the model's first
    chunk sends no gradient and its last chunk no activation, and that ZB-V's turn (chunks p-1
    and p on the last rank, ``turn``) passes both on inside the rank."""
    return 0 if plan.p == 1 else 2 * plan.v - int(first) - int(last) - 2 * int(turn)


def p2p_exposed(job: Job) -> float:
    """Seconds of one pipeline send (cached per model, cluster and layout; see _p2p_time)."""
    plan = job.plan
    return _P2P.get_or_make(
        (job.model, job.cluster), (plan.t, plan.sp, plan.mb, plan.p, plan.d), lambda: _p2p_time(job)
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


def _p2p_time(job: Job) -> float:
    """Seconds of one pipeline send (b*s*h elements). With t > 1 across nodes each TP rank
    sends b*s*h/t over its own NIC and the receivers all-gather over NVLink (Megatron's
    scatter/gather optimization, Narayanan et al. 2021, section 4.1). Inside a node the
    receiver may wait for a busy core (collectives.in_pass_wait)."""
    plan, cluster = job.plan, job.cluster
    if plan.p == 1:
        return 0.0
    bt = block_times(job.model, cluster, plan.t, bool(plan.sp), plan.mb, plan.prec)
    bw, lat, crosses = _pipeline_link(cluster, plan)
    size, extra = pipeline_send(cluster, plan, bt.act_bytes, crosses)
    return collectives.p2p_time(size, bw, lat) + extra


def weight_fill(schedule: str, backward_weight: float, forward: float) -> float:
    """What a device's passes take out of the zero-bubble schedules' bubble per microbatch. The
    critical device idles while the first microbatch's input gradients come back through the
    others: their B's, which no W can fill (its own first W follows its first B). ZB-H1's W's fill
    the rest up to a forward's worth, w + min(w, f): torch's order replayed gives
    (p - 1)(B + max(0, F - W)) for equal stages (Qi et al. 2024's (p - 1)(F + B - W) is the case
    W <= F). ZB-V's V fills all of it, w + f: (p - 1) B / 2 once halved (its chunks are half a
    device), replayed exactly while F and W are at most B, the regime of transformer layers
    (tests/test_zero_bubble.py replays both orders)."""
    return backward_weight + (forward if schedule == "zbv" else min(backward_weight, forward))


def pipeline_bubble(
    worst: float, total: float, schedule: str, v: int, worst_fill: float = 0.0, total_fill: float = 0.0
) -> float:
    """T_pipe - m * worst: the critical device's idle time, (sum_i c_i - max_i c_i), divided
    by v when interleaved; never negative (the sum includes the maximum). The zero-bubble
    schedules fill it: :func:`weight_fill` of each other device (``worst_fill`` / ``total_fill``:
    of the critical device and of all of them, counted per device), at least 0; ZB-V's is halved,
    its chunks being half a device's layers (Qi et al. 2024, section 6)."""
    if schedule == "interleaved" and v > 1:
        return (total - worst) / v
    if schedule in ZERO_BUBBLE_SCHEDULES:
        zero_bubble = max(0.0, (total - worst) - (total_fill - worst_fill))
        return zero_bubble / 2 if schedule == "zbv" else zero_bubble
    return total - worst


def pipeline_time(worst: float, total: float, m: int, schedule: str, v: int) -> float:
    """``worst``: the slowest device's time per microbatch; ``total``: the sum over devices."""
    return m * worst + pipeline_bubble(worst, total, schedule, v)


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
