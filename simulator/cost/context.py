"""Context parallelism (``cp``): each sequence split over cp ranks that pass keys and values
around a ring in every attention (one home for the rule; simulator.plan.rules.context_errors
holds its plan rules).

As Megatron-LM runs it with Transformer Engine (``AttnFuncWithCPAndKVP2P``,
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py; Megatron-LM
``get_batch_on_this_cp_rank``): the sequence is cut into 2*cp chunks and rank r keeps chunks r
and 2cp-1-r, which balances the causal mask's work. Every attention runs cp flash-attention
steps; step i works on the K/V chunk that came from the rank i places behind while the next one
travels (``flash_attn_p2p_communicate``: isend/irecv beside the step's kernel), and each step's
partial output is merged into the result with its log-sum-exp (``flash_attn_fwd_out_correction``).
The backward runs the ring again and sends the K/V gradients back with it: twice the forward's
traffic.

The cost model prices a cp plan as one rank sees it (simulator.cost.rank_view: the model at s/cp
whose queries attend over all s keys, the plan a data-parallel one of d*cp ranks over B*cp
chunks); this module adds the ring's communication (:func:`ring_exposure`).
"""

from __future__ import annotations

from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, layout
from simulator.cost.overlap import overlap_cost
from simulator.cost.rank_view import context_parallel
from simulator.specs import ModelSpec

#: the backward ring carries the K/V chunks and their gradients: twice the forward's bytes
BACKWARD_RING_TRAFFIC = 2


def kv_chunk_bytes(model: ModelSpec, b: int, t: int, e: int) -> float:
    """Bytes of one rank's K and V chunk on one tensor rank: 2 * b * (s/cp) * kv_size/t * e
    (``model`` a rank model, so seq_length is already s/cp; t divides the KV heads)."""
    return 2.0 * b * model.seq_length * model.kv_size / t * e


def ring_link(cluster: ClusterSpec, t: int, cp: int) -> collectives.GroupLink:
    """The context-parallel group's link: cp ranks t apart (tensor ranks innermost)."""
    return collectives.in_pass_link(cluster, layout.group_shape(cp, t, cluster.gpus_per_node))


def ring_times(model: ModelSpec, cluster: ClusterSpec, t: int, b: int, e: int) -> tuple[float, float]:
    """(forward, backward) seconds of one attention's ring traffic: cp-1 steps, each passing one
    K/V chunk to the next rank, as long as a ring all-gather of the cp chunks on the group's
    link (simulator.cost.collectives); the backward moves the gradients too."""
    cp = context_parallel(model)
    if cp == 1:
        return 0.0, 0.0
    forward = collectives.all_gather_time(cp * kv_chunk_bytes(model, b, t, e), cp, ring_link(cluster, t, cp))
    return forward, BACKWARD_RING_TRAFFIC * forward


def ring_exposure(
    model: ModelSpec, cluster: ClusterSpec, t: int, b: int, e: int, attention: tuple[float, float]
) -> tuple[float, float]:
    """(forward, backward) seconds the ring adds to one layer's attention. The chunk for step
    i+1 travels during step i, so the ring runs beside the first cp-1 of the cp steps,
    (cp-1)/cp of the attention's time ``attention`` = (forward, backward), at the contention
    price of simulator.cost.overlap: overlap_cost((cp-1)/cp * A, ring, sigma)."""
    cp = context_parallel(model)
    if cp == 1:
        return 0.0, 0.0
    ring_f, ring_b = ring_times(model, cluster, t, b, e)
    sigma = cluster.gpu.comm_overlap_slowdown
    beside = (cp - 1) / cp
    return (
        overlap_cost(beside * attention[0], ring_f, sigma),
        overlap_cost(beside * attention[1], ring_b, sigma),
    )
