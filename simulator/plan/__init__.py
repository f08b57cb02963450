"""Parallelization plans: the plan string, its keys and every rule a plan must keep
(docs/design.md section 2, "Plan string").

* :class:`Plan` -- one plan, parsed from ``t=8,p=8,d=24,mb=1,...``; its kinds are enums
  (:class:`Recompute`, :class:`Schedule`, :class:`Offload`, :class:`Precision`) and its fields the matching Literals;
* :func:`parse_plan_items`, :func:`resolve_plan` -- the text to typed values, defaults filled;
* :func:`plan_errors` / :func:`validate_plan` -- every divisibility and consistency rule, each
  with its own message. A plan that cannot be parsed or breaks a rule is a :class:`PlanError`.
"""

from simulator.plan.fields import (
    CKPT_MODES,
    OFFLOADS,
    PLAN_INT_KEYS,
    PLAN_KEYS,
    PLAN_STR_KEYS,
    PRECISIONS,
    SCHEDULES,
    ZERO_BUBBLE_SCHEDULES,
    ZERO_STAGES,
    Offload,
    OffloadName,
    Plan,
    Precision,
    PrecisionName,
    Recompute,
    RecomputeName,
    Schedule,
    ScheduleName,
    ZeroStage,
    num_microbatches,
)
from simulator.plan.rules import (
    context_errors,
    expert_errors,
    fp8_shape_errors,
    hsdp_errors,
    offload_errors,
    parse_plan,
    plan_errors,
    precision_errors,
    validate_plan,
    zero_bubble_errors,
)
from simulator.plan.text import check_positive, parse_plan_items, resolve_plan

__all__ = [
    "CKPT_MODES",
    "OFFLOADS",
    "PLAN_INT_KEYS",
    "PLAN_KEYS",
    "PLAN_STR_KEYS",
    "PRECISIONS",
    "SCHEDULES",
    "ZERO_BUBBLE_SCHEDULES",
    "ZERO_STAGES",
    "Offload",
    "OffloadName",
    "Plan",
    "Precision",
    "PrecisionName",
    "Recompute",
    "RecomputeName",
    "Schedule",
    "ScheduleName",
    "ZeroStage",
    "check_positive",
    "context_errors",
    "expert_errors",
    "fp8_shape_errors",
    "hsdp_errors",
    "num_microbatches",
    "offload_errors",
    "parse_plan",
    "parse_plan_items",
    "plan_errors",
    "precision_errors",
    "resolve_plan",
    "validate_plan",
    "zero_bubble_errors",
]
