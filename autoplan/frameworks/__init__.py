"""Framework profiles: which training stack runs the plan, which plans it runs, and how.

A plan's prediction depends on the software that runs it as much as on the hardware: its loss
implementation, how it overlaps gradient reduction, how it gathers ZeRO-3 parameters, the kernels
a layer launches. Each stack autoplan plans for has one profile, data in
``autoplan/frameworks/profiles/<name>.yaml``, each behaviour citing the stack's source or docs at
the release named in the file:

* ``runs`` (:class:`PlanKeys`): the plan keys the stack runs: its pipeline schedules, ZeRO
  stages (and those it runs under a pipeline), tensor, pipeline, context and expert parallelism,
  fp8 and fp8 parameters, offload targets, hybrid sharding, recomputation granularity. The search
  proposes only those plans (:mod:`autoplan.frameworks.space`); ``simulate`` and ``emit`` refuse
  a plan the stack does not run, quoting the profile's source.
* ``runtime``: how it runs them, the fields of :class:`simulator.runtime_spec.Runtime` (the cost
  model reads nothing else of a framework). autoplan's own program (``program: true``) sets
  some of them per plan: :func:`autoplan.runtime.support.program_runtime`; another stack whose
  loss changes with t > 1 says how in ``tensor_parallel_loss`` (:class:`TensorParallelLoss`).
* ``export``: the ``autoplan emit`` target that writes the stack's files (none for stacks whose
  files autoplan does not write).

Hardware figures stay in ``hwprofiles``. ``--framework NAME`` (or ``framework:`` in a cluster file)
selects a profile; autoplan's program is the default.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import Any, Literal, get_args

import yaml
from pydantic import Field, TypeAdapter, ValidationError

from hwprofiles.errors import InputError, PlanError, SpecError
from hwprofiles.load import build
from hwprofiles.schema.base import Strict
from simulator.plan import OffloadName, Plan, PrecisionName, RecomputeName, ScheduleName, ZeroStage
from simulator.runtime_spec import CrossEntropy, Runtime
from simulator.specs import ModelSpec

FrameworkName = Literal["autoplan", "megatron", "deepspeed", "torchtitan", "fsdp", "llm-foundry"]
FRAMEWORKS: tuple[FrameworkName, ...] = get_args(FrameworkName)
DEFAULT: FrameworkName = "autoplan"
ExportTarget = Literal["torch", "megatron", "deepspeed", "torchtitan"]

#: the Runtime fields a profile may set (its name is the profile's)
RUNTIME_FIELDS = tuple(f.name for f in dataclasses.fields(Runtime) if f.name != "name")


class PlanKeys(Strict):
    """The plan keys a stack runs (module docstring); a plan outside them is not proposed."""

    schedules: tuple[ScheduleName, ...] = Field(min_length=1)  # with p > 1 (one stage is 1F1B everywhere)
    zero: tuple[ZeroStage, ...] = Field(min_length=1)
    zero_with_pipeline: tuple[ZeroStage, ...]  # the ZeRO stages it runs with p > 1
    tensor: bool = True  # t > 1
    pipeline: bool = True  # p > 1
    cp: bool = True  # context parallelism
    ep: bool = True  # expert parallelism
    prec: tuple[PrecisionName, ...] = Field(min_length=1)
    fp8ag: bool = False  # fp8 parameters gathered in fp8
    offload: tuple[OffloadName, ...] = Field(min_length=1)
    offload_zero: tuple[ZeroStage, ...] = (1, 2, 3)  # the ZeRO stages its offload runs with
    hsdp: bool = False  # hybrid sharding
    ckpt: tuple[RecomputeName, ...] = Field(min_length=1)
    experts_zero: tuple[ZeroStage, ...] = (0, 1, 2, 3)  # the ZeRO stages with ep > 1
    experts_tensor: bool = True  # a mixture of experts with t > 1
    sp_without_pipeline: bool = True  # sequence parallelism with t > 1 and p = 1


class TensorParallelLoss(Strict):
    """The cross-entropy a stack runs on a plan with t > 1, where it is not its ``runtime``'s
    (the t = 1 one): without a pipeline and with one (simulator.runtime_spec.Runtime.cross_entropy)."""

    without_pipeline: CrossEntropy
    with_pipeline: CrossEntropy


class Framework(Strict):
    """One training stack's profile (module docstring)."""

    name: FrameworkName
    title: str
    release: str
    export: ExportTarget | None = None
    program: bool = False  # autoplan's own program: the runtime follows each plan
    runs: PlanKeys
    runtime: dict[str, Any] = Field(default_factory=dict)
    tensor_parallel_loss: TensorParallelLoss | None = None  # where t > 1 changes the loss
    sources: dict[str, str] = Field(default_factory=dict)

    def base_runtime(self) -> Runtime:
        """The profile's :class:`Runtime` (before any per-plan rule of autoplan's program)."""
        return _runtime(self.name, tuple(sorted(self.runtime.items())))

    def loss_runtime(self, runtime: Runtime, tensor: bool, pipeline: bool) -> Runtime:
        """``runtime`` with the loss the stack runs on a plan with t > 1 (``tensor``) under a
        pipeline or not (:attr:`tensor_parallel_loss`, as Runtime.tensor_parallel_cross_entropy);
        unchanged where that rule is silent. A plan with t = 1 gets the loss without a pipeline
        (it computes ``cross_entropy``), so its runtime is that of the t > 1 plans without one."""
        rule = self.tensor_parallel_loss
        if rule is None:
            return runtime
        loss = rule.with_pipeline if tensor and pipeline else rule.without_pipeline
        return dataclasses.replace(runtime, tensor_parallel_cross_entropy=loss)

    def source(self, key: str) -> str:
        """The profile's citation for ``key``, as ' (source)', or '' when it gives none."""
        text = self.sources.get(key)
        return f" ({text})" if text else ""

    def refusals(self, model: ModelSpec, fields: Mapping[str, Any]) -> Iterator[str]:
        """Why the stack does not run a plan with ``fields`` (any subset of the plan's keys:
        a rule whose keys are missing is skipped), each reason citing the profile's source."""
        yield from _refusals(self, model, fields)

    def refusal(self, model: ModelSpec, plan: Plan) -> str | None:
        """The first reason the stack does not run ``plan``, or None."""
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}  # read only: no deep copy
        return next(self.refusals(model, fields), None)


@functools.lru_cache(maxsize=32)
def _runtime(name: str, items: tuple[tuple[str, Any], ...]) -> Runtime:
    """The Runtime of ``items`` with its fields' types checked (Literal values included)."""
    return TypeAdapter(Runtime).validate_python({"name": name, **dict(items)})


def _refusals(fw: Framework, model: ModelSpec, f: Mapping[str, Any]) -> Iterator[str]:
    """:meth:`Framework.refusals`: one rule per plan key, written once for the search's shapes,
    its option rows and a whole plan."""
    r, name = fw.runs, fw.name
    t, p, ep = f.get("t", 1), f.get("p", 1), f.get("ep", 1)
    for key, flag, value in (("tensor", "t", t), ("pipeline", "p", p), ("cp", "cp", f.get("cp", 1)), ("ep", "ep", ep)):
        if value > 1 and not getattr(r, key):
            yield f"{name} does not run {flag}={value}{fw.source(key) or fw.source('zero')}"
    if p > 1 and "schedule" in f and f["schedule"] not in r.schedules:
        yield f"{name} does not run schedule={f['schedule']}{fw.source('schedules')}"
    if model.num_experts and t > 1 and not r.experts_tensor:
        yield f"{name} does not run a mixture of experts with t={t}{fw.source('experts')}"
    if f.get("sp") and t > 1 and p == 1 and not r.sp_without_pipeline:
        yield f"{name} does not run sp=1 without a pipeline{fw.source('sp_without_pipeline')}"
    if "zero" in f:
        yield from _state_refusals(fw, f)


def _state_refusals(fw: Framework, f: Mapping[str, Any]) -> Iterator[str]:
    """The option keys' rules: ZeRO stage (with a pipeline, with experts), precision, fp8
    parameters, offload, hybrid sharding, recomputation."""
    r, name, zero = fw.runs, fw.name, f["zero"]
    if zero not in r.zero:
        yield f"{name} does not run zero={zero}{fw.source('zero')}"
    elif f.get("p", 1) > 1 and zero not in r.zero_with_pipeline:
        yield f"{name} does not run zero={zero} with a pipeline (p > 1){fw.source('zero_with_pipeline')}"
    if f.get("ep", 1) > 1 and zero not in r.experts_zero:
        yield f"{name} does not run ep={f['ep']} with zero={zero}{fw.source('experts')}"
    if f.get("prec", "bf16") not in r.prec:
        yield f"{name} does not run prec={f['prec']}{fw.source('prec')}"
    if f.get("fp8ag") and not r.fp8ag:
        yield f"{name} does not gather fp8 parameters (fp8ag=1){fw.source('fp8ag')}"
    offload = f.get("offload", "none")
    if offload not in r.offload or (offload != "none" and zero not in r.offload_zero):
        yield f"{name} does not run offload={offload} with zero={zero}{fw.source('offload')}"
    if f.get("hsdp") and not r.hsdp:
        yield f"{name} does not run hybrid sharding (hsdp){fw.source('hsdp')}"
    if f.get("ckpt", "none") not in r.ckpt:
        yield f"{name} does not run ckpt={f['ckpt']}{fw.source('ckpt')}"
    recompute = f.get("recompute")
    if recompute and "selective" not in r.ckpt and any(s for _, s in recompute):
        yield f"{name} does not run selective recomputation{fw.source('ckpt')}"


@functools.lru_cache(maxsize=len(FRAMEWORKS))
def load_framework(name: str) -> Framework:
    """The profile named ``name`` (one of :data:`FRAMEWORKS`); InputError for any other name."""
    if name not in FRAMEWORKS:
        raise InputError(f"unknown framework {name!r} (expected one of {', '.join(FRAMEWORKS)})")
    path = resources.files("autoplan.frameworks").joinpath("profiles", f"{name}.yaml")
    return parse_framework(yaml.safe_load(path.read_text()), f"autoplan/frameworks/profiles/{name}.yaml")


def parse_framework(data: Any, source: str) -> Framework:
    """A profile from its YAML ``data``; SpecError (one line naming ``source``) for a key it does
    not know, a value of the wrong kind, or a runtime field that is not one of Runtime's."""
    fw: Framework = build(Framework, data, source)
    unknown = sorted(set(fw.runtime) - set(RUNTIME_FIELDS))
    if unknown:
        raise SpecError(
            f"{source}: runtime: not Runtime fields: {', '.join(unknown)} (known: {', '.join(RUNTIME_FIELDS)})"
        )
    try:
        fw.base_runtime()
    except ValidationError as e:
        problem = e.errors()[0]
        where = ".".join(map(str, problem["loc"]))
        raise SpecError(f"{source}: runtime: {where}: {problem['msg']}") from None
    return fw


def check_plan(fw: Framework, model: ModelSpec, plan: Plan, option: str = "--plan") -> None:
    """PlanError (exit 2) when the stack does not run ``plan``, naming the key, the source and
    the frameworks that do run it."""
    why = fw.refusal(model, plan)
    if why:
        others = [name for name in FRAMEWORKS if name != fw.name and not load_framework(name).refusal(model, plan)]
        where = f"--framework {' or '.join(others)} runs it; " if others else ""
        raise PlanError(f"{option}: {why}; {where}'autoplan plan --framework {fw.name}' plans for {fw.name}")


def framework_of_target(target: ExportTarget) -> Framework:
    """The framework whose files ``autoplan emit --target TARGET`` writes (the profile whose
    ``export`` it is): a tool's files are priced as that stack runs them."""
    return next(fw for fw in map(load_framework, FRAMEWORKS) if fw.export == target)
