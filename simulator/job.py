"""A job: everything one prediction needs (model, cluster, validated plan, batch, runtime)."""

from __future__ import annotations

from dataclasses import dataclass

from hwprofiles.schema import ClusterSpec
from simulator.plan import Plan, num_microbatches, validate_plan
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class Runtime:
    """How the training program schedules what lies outside the model's math.

    ``dp_overlap``: gradient reduction is bucketed and overlapped with the backward pass
    (PyTorch DDP/FSDP, Megatron-core ``--overlap-grad-reduce``, DeepSpeed with buckets).
    False: one reduction after the last backward (Megatron-LM's 2021 "local" DDP,
    Megatron-DeepSpeed with gradient bucketing off, as in the vTrain measurements)."""

    name: str = "overlapped"
    dp_overlap: bool = True


OVERLAPPED = Runtime("overlapped", dp_overlap=True)
NO_DP_OVERLAP = Runtime("no-dp-overlap", dp_overlap=False)


@dataclass(frozen=True)
class Job:
    """Everything one prediction needs: model, cluster, a validated plan, the batch, and
    how the program runs (``runtime``)."""

    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    global_batch: int
    runtime: Runtime = OVERLAPPED

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
