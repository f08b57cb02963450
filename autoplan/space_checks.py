"""Why the search space can be empty: before enumerating, whether any plan can use every GPU of
the cluster (:func:`check_cluster_size`); after, which rule the ``--fix`` pins break when they
leave no plan (:func:`explain_empty`). The bounds are those of :mod:`autoplan.space`'s axes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoplan.space import MAX_MB, context_splits, tensor_splits
from hwprofiles.errors import PlanError
from simulator.plan import plan_errors, resolve_plan
from simulator.specs import ModelSpec


def largest_context_split(model: ModelSpec) -> int:
    """The largest cp the search tries for the model's sequence (on enough GPUs)."""
    return max(context_splits(model, 2 ** model.seq_length.bit_length(), {}))


def max_usable_gpus(model: ModelSpec, global_batch: int) -> int:
    """The most GPUs any plan the search tries can occupy: d <= global batch (one sequence per
    replica at least), t <= the largest split of the heads, KV groups and FFN, p <= layers (one
    layer per stage), cp <= the largest context split (:func:`autoplan.space.context_splits`)."""
    return global_batch * max(tensor_splits(model)) * model.num_layers * largest_context_split(model)


#: the largest global batch the search enumerates: its microbatch sizes are the divisors of B / d,
#: found by trial division up to the square root (2**20 steps here; a batch of 2**60 took minutes).
#: Published runs use at most a few thousand sequences per step.
MAX_GLOBAL_BATCH = 2**40


def check_cluster_size(model: ModelSpec, gpus: int, global_batch: int) -> None:
    """PlanError when the batch is beyond :data:`MAX_GLOBAL_BATCH` or no plan can use every GPU of
    the cluster (before any plan is enumerated)."""
    if global_batch > MAX_GLOBAL_BATCH:
        raise PlanError(
            f"--global-batch {global_batch:,}: the search takes at most {MAX_GLOBAL_BATCH:,} sequences per step "
            "(`simulate --plan` prices any batch)"
        )
    most = max_usable_gpus(model, global_batch)
    if gpus > most:
        cp = largest_context_split(model)
        raise PlanError(
            f"no plan can use {gpus:,} GPUs: {model.name} with global batch {global_batch} occupies at most "
            f"{most:,} (d <= batch, t <= {max(tensor_splits(model))}, p <= {model.num_layers} layers"
            f"{f', cp <= {cp}' if cp > 1 else ''}); "
            "give fewer --nodes or a larger --global-batch"
        )


def explain_empty(model: ModelSpec, gpus: int, global_batch: int, fix: Mapping[str, Any]) -> str:
    """Why no plan satisfies the pins (or, with none, why no split fits the cluster): the first
    rule broken (the message of the PlanError the caller raises)."""
    if not fix:
        return (
            f"no valid plan for {gpus:,} GPUs and global batch {global_batch}: no t*p*d = {gpus:,} with t dividing "
            f"the heads, p <= {model.num_layers} layers and d dividing the batch; try a --global-batch that "
            "the data-parallel size divides, or another --nodes"
        )
    try:
        plan = resolve_plan(fix, gpus, "--fix")
    except PlanError as e:
        return str(e)
    errors = plan_errors(model, plan, gpus, global_batch)
    if errors:
        return f"--fix: {errors[0]}"
    if plan.mb > MAX_MB and "mb" not in fix:
        return f"--fix: no microbatch size <= {MAX_MB} divides B/d"
    return f"--fix: the pinned values {fix} leave no valid plan for {gpus} GPUs and global batch {global_batch}"
