"""A job: everything one prediction needs (model, cluster, validated plan, batch, runtime)."""

from __future__ import annotations

from dataclasses import dataclass

from hwprofiles.errors import PlanError
from hwprofiles.schema import ClusterSpec
from simulator.plan import Plan, num_microbatches, offload_errors, precision_errors, validate_plan
from simulator.runtime_spec import OVERLAPPED, Runtime
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class Job:
    """Everything one prediction needs: model, cluster, a validated plan, the batch, and
    how the program runs (``runtime``)."""

    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    global_batch: int
    runtime: Runtime = OVERLAPPED

    def __post_init__(self) -> None:
        """The plan's precision must be one the cluster's GPUs run, and its offload one its nodes
        have (simulator.plan.precision_errors, offload_errors)."""
        errors = precision_errors(self.plan, self.cluster.gpu) + offload_errors(self.plan, self.cluster.node)
        if errors:
            raise PlanError(errors[0])

    @property
    def m(self) -> int:
        """Microbatches per pipeline per iteration: B / (d * mb)."""
        return num_microbatches(self.plan, self.global_batch)

    @property
    def seq(self) -> int:
        return self.model.seq_length

    @staticmethod
    def make(
        model: ModelSpec,
        cluster: ClusterSpec,
        plan: Plan,
        global_batch: int,
        source: str = "--plan",
        runtime: Runtime = OVERLAPPED,
    ) -> Job:
        validate_plan(model, plan, cluster.num_gpus, global_batch, source)
        return Job(model, cluster, plan, global_batch, runtime)
