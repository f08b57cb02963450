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

A rank's view (:func:`rank_view`): all a rank computes and keeps except attention is that of
the same model at sequence s/cp, and the plan is a data-parallel plan over sequence chunks:

    (model at s, plan t, cp, p, d, batch B)  ->  (model at s/cp, plan t, p, d*cp, batch B*cp)

Megatron orders ranks tp, cp, dp, pp, so the d*cp ranks that hold the same weights stride by t
like a data-parallel group of that size; gradients are reduced and ZeRO states sharded over
them (Megatron's distributed optimizer over the data-parallel-with-context group; torchtitan's
FSDP2 mesh ``dp_shard_cp``); B*cp chunks in microbatches of mb make B/(d*mb) microbatches per
pipeline, as the plan has. What the view does not carry is this module's: a query attends over
all s keys (:attr:`RankModel.attention_keys`: the attention's FLOPs and K/V reads,
simulator.cost.attention), learned position embeddings keep s rows
(:attr:`RankModel.max_positions`), and the ring's communication (:func:`ring_exposure`).
"""

from __future__ import annotations

import dataclasses

from pydantic import Field

from hwprofiles.schema import ClusterSpec
from simulator.cost import collectives, layout
from simulator.cost.cache import IdentityCache
from simulator.cost.overlap import overlap_cost
from simulator.job import Job
from simulator.plan import Plan
from simulator.specs import ModelSpec

#: the backward ring carries the K/V chunks and their gradients: twice the forward's bytes
BACKWARD_RING_TRAFFIC = 2

_RANK_MODELS = IdentityCache(64)


class RankModel(ModelSpec):
    """The model as one of ``context_parallel`` ranks runs it: ``seq_length`` is the rank's
    s/cp tokens of each sequence, whose queries attend over all cp*(s/cp) keys."""

    context_parallel: int = Field(ge=1)

    @property
    def attention_keys(self) -> int:
        return self.seq_length * self.context_parallel

    @property
    def max_positions(self) -> int:
        return self.seq_length * self.context_parallel


def rank_model(model: ModelSpec, cp: int) -> ModelSpec:
    """The model one context-parallel rank runs (the model itself when cp = 1); one object per
    (model, cp), so the stage-cost caches keyed by identity keep working."""
    if cp == 1:
        return model
    return _RANK_MODELS.get_or_make(
        (model,),
        cp,
        lambda: RankModel(**model.model_dump(), context_parallel=cp).model_copy(
            update={"seq_length": model.seq_length // cp}
        ),
    )


def rank_plan(plan: Plan) -> Plan:
    """The plan as a rank sees it: d*cp data-parallel ranks over sequence chunks, cp = 1."""
    return plan if plan.cp == 1 else plan.replace(d=plan.grad_group, cp=1)


def user_plan(priced: Plan, cp: int) -> Plan:
    """Back from :func:`rank_plan` (e.g. a layer split chosen on the rank's view)."""
    return priced if cp == 1 else priced.replace(d=priced.d // cp, cp=cp)


def rank_view(model: ModelSpec, plan: Plan, global_batch: int) -> tuple[ModelSpec, Plan, int]:
    """(rank model, rank plan, batch of sequence chunks B*cp): what the cost model prices."""
    return rank_model(model, plan.cp), rank_plan(plan), global_batch * plan.cp


def rank_job(job: Job) -> Job:
    """The job the cost model prices for a context-parallel plan (the job itself at cp = 1)."""
    if job.plan.cp == 1:
        return job
    model, plan, batch = rank_view(job.model, job.plan, job.global_batch)
    return dataclasses.replace(job, model=model, plan=plan, global_batch=batch)


def context_parallel(model: ModelSpec) -> int:
    """The cp a (rank) model was cut for: 1 for a whole model."""
    return model.context_parallel if isinstance(model, RankModel) else 1


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
