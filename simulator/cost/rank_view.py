"""A plan as one rank sees it: what the cost model prices for context and expert parallelism.

Context parallelism (cp, simulator.cost.context) splits each sequence over cp ranks; expert
parallelism (ep, simulator.cost.experts) splits a mixture of experts' E experts over ep ranks.
Seen from one rank, both leave the rest of the plan a plain one:

    (model at s, plan t, cp, ep, p, d, batch B)
        ->  (model at s/cp holding E/ep experts, plan t, p, d*cp, batch B*cp)

Megatron-LM orders ranks tp, cp, dp, pp, so the d*cp ranks that hold the same weights stride by
t like a data-parallel group of that size; gradients are reduced and ZeRO states sharded over
them (Megatron's distributed optimizer over the data-parallel-with-context group; torchtitan's
FSDP2 mesh ``dp_shard_cp``); B*cp chunks in microbatches of mb make B/(d*mb) microbatches per
pipeline, as the plan has. Expert-parallel ranks are carved from those d*cp ranks (Megatron's
expert rank order tp, ep, dp, pp: ep consecutive ones, stride t), each holding E/ep experts,
whose states are sharded over the d*cp/ep ranks holding the same experts
(:attr:`simulator.cost.stage.StageCost.sharded_params`).

What the view does not carry is priced by the model it returns (:class:`RankModel`): a query
attends over all s keys (``attention_keys``), learned positions keep s rows (``max_positions``),
a rank holds ``local_experts`` of the E experts, and the K/V ring and token all-to-alls
(simulator.cost.context, simulator.cost.experts).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pydantic import Field

from simulator.cost.cache import IdentityCache
from simulator.plan import Plan
from simulator.specs import ModelSpec

if TYPE_CHECKING:
    from simulator.job import Job

_RANK_MODELS = IdentityCache(64)


class RankModel(ModelSpec):
    """The model as one rank runs it: ``seq_length`` is its s/cp tokens of each sequence (whose
    queries attend over all cp*(s/cp) keys), and it holds E/ep of the experts."""

    context_parallel: int = Field(ge=1)
    expert_parallel: int = Field(ge=1)

    @property
    def attention_keys(self) -> int:
        return self.seq_length * self.context_parallel

    @property
    def max_positions(self) -> int:
        return self.seq_length * self.context_parallel

    @property
    def local_experts(self) -> int:
        return self.experts // self.expert_parallel


def rank_model(model: ModelSpec, cp: int, ep: int = 1) -> ModelSpec:
    """The model one rank runs (the model itself when cp = ep = 1); one object per (model, cp,
    ep), so the stage-cost caches keyed by identity keep working."""
    if cp == 1 and ep == 1:
        return model
    return _RANK_MODELS.get_or_make(
        (model,),
        (cp, ep),
        lambda: RankModel(**model.model_dump(), context_parallel=cp, expert_parallel=ep).model_copy(
            update={"seq_length": model.seq_length // cp}
        ),
    )


def context_parallel(model: ModelSpec) -> int:
    """The cp a (rank) model was cut for: 1 for a whole model."""
    return model.context_parallel if isinstance(model, RankModel) else 1


def expert_parallel(model: ModelSpec) -> int:
    """The ep a (rank) model was cut for: 1 for a whole model."""
    return model.expert_parallel if isinstance(model, RankModel) else 1


def rank_plan(plan: Plan) -> Plan:
    """The plan as a rank sees it: d*cp data-parallel ranks over sequence chunks, cp = ep = 1."""
    return plan if plan.cp == 1 and plan.ep == 1 else plan.replace(d=plan.grad_group, cp=1, ep=1)


def user_plan(priced: Plan, plan: Plan) -> Plan:
    """``priced`` (a rank plan, e.g. with a layer split chosen on it) as ``plan``'s user plan."""
    return priced if plan.cp == 1 and plan.ep == 1 else priced.replace(d=plan.d, cp=plan.cp, ep=plan.ep)


def rank_view(model: ModelSpec, plan: Plan, global_batch: int) -> tuple[ModelSpec, Plan, int]:
    """(rank model, rank plan, batch of sequence chunks B*cp): what the cost model prices."""
    return rank_model(model, plan.cp, plan.ep), rank_plan(plan), global_batch * plan.cp


def rank_job(job: Job) -> Job:
    """The job the cost model prices (the job itself at cp = ep = 1)."""
    if job.plan.cp == 1 and job.plan.ep == 1:
        return job
    model, plan, batch = rank_view(job.model, job.plan, job.global_batch)
    return dataclasses.replace(job, model=model, plan=plan, global_batch=batch)
