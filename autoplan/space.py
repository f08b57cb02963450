"""The search space: every valid plan for a model, a cluster size and a global batch.

Axes (docs/design.md section 5): t divides the heads, KV groups and ffn; ep divides a mixture of
experts' experts and d*cp (1 for a dense model); cp 1 or a power of two
leaving at least MIN_CP_TOKENS tokens per rank; p <= layers and t*cp*p divides the GPUs;
d = GPUs / (t*cp*p); mb divides B/d; zero 0-3; ckpt none/selective/full;
schedule gpipe/1f1b/zbh1/zbv (zero <= 1; zbv: v = 2, 2p dividing the layers) and interleaved with v in
2..MAX_V dividing layers/p (and m % p == 0);
offload none/cpu (zero >= 1)/nvme (zero = 3, on nodes with NVMe drives: :func:`offloads`); sp 0/1
(t > 1); prec bf16, and fp8 on GPUs that run it (:func:`precisions`), with fp8 parameters
(fp8ag=1) where a sharded optimizer or FSDP keeps them (:func:`fp8_param_options`: they save
memory and gather traffic, and cost nothing, so fp8ag=0 is tried only when pinned). Microbatches are capped at MAX_MB sequences: larger ones only raise
activation memory once GEMMs are saturated. Whether any plan can use the cluster, and why the pins
leave none: :mod:`autoplan.space_checks`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from hwprofiles.errors import PlanError
from hwprofiles.schema import GpuProfile, NodeProfile
from simulator.cost.cache import IdentityCache
from simulator.plan import (
    CKPT_MODES,
    OFFLOADS,
    PRECISIONS,
    ZERO_BUBBLE_SCHEDULES,
    ZERO_STAGES,
    OffloadName,
    Plan,
    PrecisionName,
    RecomputeName,
    ScheduleName,
    ZeroStage,
    check_positive,
    context_errors,
    fp8_shape_errors,
    hsdp_errors,
    offload_errors,
    parse_plan_items,
    precision_errors,
    zero_bubble_errors,
)
from simulator.plan.table import Factor, PlanTable
from simulator.specs import ModelSpec

MAX_MB = 16
MAX_V = 8


def divisors(n: int) -> list[int]:
    small = [i for i in range(1, int(n**0.5) + 1) if n % i == 0]
    return sorted(set(small + [n // i for i in small]))


#: context parallelism is searched down to this many tokens of a sequence per rank: below it the
#: rank's attention is too short to hide the ring and the activations it saves are small (NeMo's
#: long-context recipes split 16k-128k sequences into chunks of 8k-16k); --fix cp=N tries any cp
MIN_CP_TOKENS = 8192


class Shape(NamedTuple):
    """The parallel layout part of a plan: what fixes the per-stage work (a named tuple: a
    search makes one per layout, 200,000 over a 175B sweep's sizes)."""

    t: int
    p: int
    d: int
    mb: int
    sp: int
    schedule: ScheduleName
    v: int
    cp: int = 1
    ep: int = 1


#: plan keys that describe one plan's split, not a family of plans: the search chooses them per
#: finalist (CP-SAT, autoplan.partition); ``simulate`` and ``emit`` take them with ``--plan``
PER_PLAN_KEYS = ("layers", "recompute")


def parse_fix(text: str) -> dict[str, Any]:
    """``--fix KEY=VAL,...``: the pinned plan keys (same syntax and checks as --plan; PlanError).
    A layer split or a per-layer recomputation map (:data:`PER_PLAN_KEYS`) is refused: it holds for
    one p and v only, and the search would have left it out without a word."""
    items = parse_plan_items(text, "--fix") if text and text.strip() else {}
    check_positive(items, "--fix")
    per_plan = [k for k in PER_PLAN_KEYS if k in items]
    if per_plan:
        raise PlanError(
            f"--fix {per_plan[0]}=...: the search chooses each finalist's layer split and recomputation (CP-SAT); "
            "pin ckpt= to fix the recomputation, or give the whole plan with `simulate --plan` or `emit --plan`"
        )
    return items


def tensor_splits(model: ModelSpec) -> list[int]:
    """The tensor-parallel sizes t the model allows: t divides the heads, the KV groups and the FFN
    (the rules of :func:`simulator.plan.plan_errors`, which names the one broken)."""
    return [t for t in divisors(model.num_attention_heads) if model.kv_heads % t == 0 and model.ffn % t == 0]


def context_splits(model: ModelSpec, gpus: int, fix: Mapping[str, Any]) -> list[int]:
    """The context-parallel sizes cp the search tries on ``gpus`` ranks (GPUs / t): 1, and powers
    of two down to MIN_CP_TOKENS tokens per rank that keep the plan rules (2*cp divides the
    sequence, flash attention: simulator.plan.context_errors); ``cp`` pinned: only that value."""
    if "cp" in fix:
        cp = fix["cp"]
        return [cp] if gpus % cp == 0 and not context_errors(model, Plan(cp=cp)) else []
    out, cp = [1], 2
    while model.seq_length // cp >= MIN_CP_TOKENS and gpus % cp == 0:
        if not context_errors(model, Plan(cp=cp)):
            out.append(cp)
        cp *= 2
    return out


def expert_splits(model: ModelSpec, grad_group: int, fix: Mapping[str, Any]) -> list[int]:
    """The expert-parallel sizes ep the search tries: 1 for a dense model; for a mixture of
    experts every divisor of its experts that divides the d*cp ranks holding the same weights
    (simulator.plan.expert_errors); ``ep`` pinned: only that value."""
    want = fix.get("ep")
    found = [ep for ep in divisors(model.experts) if grad_group % ep == 0] if model.num_experts else [1]
    return [ep for ep in found if want in (None, ep)]


def shapes(model: ModelSpec, gpus: int, global_batch: int, fix: Mapping[str, Any]) -> Iterator[Shape]:
    allowed = set(tensor_splits(model))
    for t in divisors(gpus):
        if t not in allowed or fix.get("t", t) != t:
            continue
        for cp in context_splits(model, gpus // t, fix):
            for p in divisors(gpus // (t * cp)):
                if p > model.num_layers or fix.get("p", p) != p:
                    continue
                d = gpus // (t * cp * p)
                if fix.get("d", d) != d or global_batch % d:
                    continue
                for mb in divisors(global_batch // d):
                    if (mb > MAX_MB and "mb" not in fix) or fix.get("mb", mb) != mb:
                        continue
                    m = global_batch // (d * mb)
                    for sp in (0, 1) if t > 1 and model.seq_length % (t * cp) == 0 else (0,):
                        if fix.get("sp", sp) != sp:
                            continue
                        for ep in expert_splits(model, d * cp, fix):
                            for schedule, v in _schedules(model, p, m, fix):
                                yield Shape(t, p, d, mb, sp, schedule, v, cp, ep)


def _schedules(model: ModelSpec, p: int, m: int, fix: Mapping[str, Any]) -> Iterator[tuple[ScheduleName, int]]:
    want = fix.get("schedule")
    if p == 1:
        if want in (None, "1f1b") and fix.get("v", 1) == 1:
            yield "1f1b", 1
        return
    for sched in ("1f1b", "gpipe", "zbh1"):
        if want in (None, sched) and fix.get("v", 1) == 1:
            yield sched, 1
    if want in (None, "zbv") and model.num_layers % (2 * p) == 0 and fix.get("v", 2) == 2:
        yield "zbv", 2
    if want in (None, "interleaved") and m % p == 0 and model.num_layers % p == 0:
        per_stage = model.num_layers // p
        for v in range(2, min(MAX_V, per_stage) + 1):
            if per_stage % v == 0 and fix.get("v", v) == v:
                yield "interleaved", v


def memory_options(
    fix: Mapping[str, Any], offloads: tuple[OffloadName, ...] = OFFLOADS
) -> list[tuple[ZeroStage, RecomputeName, OffloadName]]:
    """(zero, ckpt, offload) combinations allowed by the rules and the pins, offloading only to
    ``offloads`` (what the node has: :func:`offloads`)."""
    out = []
    for zero in ZERO_STAGES:
        for ckpt in CKPT_MODES:
            for off in offloads:
                if (off == "cpu" and zero == 0) or (off == "nvme" and zero != 3):
                    continue
                if fix.get("zero", zero) != zero or fix.get("ckpt", ckpt) != ckpt or fix.get("offload", off) != off:
                    continue
                out.append((zero, ckpt, off))
    return out


def precisions(gpu: GpuProfile, fix: Mapping[str, Any]) -> tuple[PrecisionName, ...]:
    """The precisions the search tries: bf16, and fp8 where the GPU runs it (its profile gives an
    fp8 peak and fp8 GEMM efficiency); ``prec`` pinned: only that one (PlanError when the GPU
    cannot run it)."""
    return _runnable("prec", PRECISIONS, lambda plan: precision_errors(plan, gpu), fix)


def offloads(node: NodeProfile, fix: Mapping[str, Any]) -> tuple[OffloadName, ...]:
    """The offload targets the search tries: none and cpu, and nvme where the node has NVMe
    drives (simulator.plan.offload_errors); ``offload`` pinned: only that one (PlanError when
    the node has no such target)."""
    return _runnable("offload", OFFLOADS, lambda plan: offload_errors(plan, node), fix)


def _runnable(key: str, values: tuple[Any, ...], errors: Callable[[Plan], list[str]], fix: Mapping[str, Any]) -> tuple:
    """The ``values`` of plan key ``key`` whose one-key plan has no ``errors``; pinned in ``fix``:
    only that value (PlanError when it has errors)."""
    if key in fix:
        found = errors(Plan(**{key: fix[key]}))
        if found:
            raise PlanError(f"--fix: {found[0]}")
        return (fix[key],)
    return tuple(v for v in values if not errors(Plan(**{key: v})))


def plan_of(
    shape: Shape, zero: ZeroStage, ckpt: RecomputeName, offload: OffloadName, prec: PrecisionName = "bf16"
) -> Plan:
    return Plan(
        t=shape.t,
        p=shape.p,
        d=shape.d,
        mb=shape.mb,
        zero=zero,
        ckpt=ckpt,
        v=shape.v,
        schedule=shape.schedule,
        offload=offload,
        sp=shape.sp,
        prec=prec,
        cp=shape.cp,
        ep=shape.ep,
    )


def enumerate_plans(
    model: ModelSpec,
    gpus: int,
    global_batch: int,
    fix: Mapping[str, Any],
    gpus_per_node: int = 0,
    precs: tuple[PrecisionName, ...] = ("bf16",),
    offloads: tuple[OffloadName, ...] = OFFLOADS,
) -> list[Plan]:
    """Every valid plan (uniform layer split) under the pins, in each of ``precs`` its shape
    allows (fp8 GEMM dimensions, simulator.plan.fp8_shape_errors); with ``gpus_per_node``, each
    ZeRO-2/3 plan also with hybrid sharding inside a node (:func:`hsdp_options`); offloading only
    to ``offloads`` (:func:`offloads`)."""
    return plans_of(model, list(shapes(model, gpus, global_batch, fix)), fix, gpus_per_node, precs, offloads)


def plans_of(
    model: ModelSpec,
    layouts: Sequence[Shape],
    fix: Mapping[str, Any],
    gpus_per_node: int = 0,
    precs: tuple[PrecisionName, ...] = ("bf16",),
    offloads: tuple[OffloadName, ...] = OFFLOADS,
) -> list[Plan]:
    """The plans of :func:`enumerate_plans` whose shapes are ``layouts``, in their order."""
    return list(plan_table(model, layouts, fix, gpus_per_node, precs, offloads))


#: what of a shape its :func:`layout_options` depend on, with whether its schedule is a zero-bubble
#: one (which limits the ZeRO stage): t, mb and cp (the fp8 GEMM shapes), d, cp and ep (the ranks
#: hybrid sharding divides), t (the shard group that fills a node)
_OPTION_KEY = attrgetter("t", "mb", "cp", "d", "ep")
#: the option factor's fields, as :func:`layout_options` lists them
OPTION_FIELDS = ("prec", "zero", "ckpt", "offload", "hsdp", "fp8ag")
SHAPE_FIELDS = Shape._fields

#: the option rows of each option key (:func:`plan_table`), per model, framework rule and
#: (memory options, pins, GPUs per node, precisions), which key it as they are (pins of plain
#: ints, strings and tuples, as parse_fix gives them; precisions a tuple): a sweep's sizes share them
_OPTIONS = IdentityCache(64)

#: a framework's rule for a shape's option rows (autoplan.frameworks.space.option_rule): does the
#: stack run ``shape`` with the (prec, zero, ckpt, offload, hsdp, fp8ag) ``row``
OptionRule = Callable[[Shape, tuple[Any, ...]], bool]


class _OptionRows:
    """The option rows of the option keys seen, each distinct row numbered once for every table
    that shares them (:data:`_OPTIONS`; in the order first seen), each key's rows as those numbers."""

    def __init__(self) -> None:
        self.number: dict[tuple[Any, ...], int] = {}
        self.of_key: dict[tuple[Any, ...], np.ndarray] = {}

    def add(self, key: tuple[Any, ...], found: list[tuple[Any, ...]]) -> np.ndarray:
        self.of_key[key] = np.array([self.number.setdefault(r, len(self.number)) for r in found], dtype=np.int64)
        return self.of_key[key]


def plan_table(
    model: ModelSpec,
    layouts: Sequence[Shape],
    fix: Mapping[str, Any],
    gpus_per_node: int = 0,
    precs: tuple[PrecisionName, ...] = ("bf16",),
    offloads: tuple[OffloadName, ...] = OFFLOADS,
    keep: OptionRule | None = None,
) -> PlanTable:
    """:func:`plans_of` as a :class:`PlanTable` (what the search's workers score): each shape
    with each of its :func:`layout_options`, listed once per distinct :data:`_OPTION_KEY` (and
    pipeline or not), the option factor's rows in the order the plans first have them; ``keep``:
    only the option rows a framework runs with the shape."""
    memory = memory_options(fix, offloads)
    known = _OPTIONS.get_or_make(
        (model, keep), (tuple(memory), tuple(sorted(fix.items())), gpus_per_node, precs), _OptionRows
    )
    per_shape = []
    for s in layouts:
        key = (*_OPTION_KEY(s), s.schedule in ZERO_BUBBLE_SCHEDULES, s.p > 1)
        ids = known.of_key.get(key)
        if ids is None:
            found = layout_options(model, s, memory, fix, gpus_per_node, precs)
            ids = known.add(key, found if keep is None else [row for row in found if keep(s, row)])
        per_shape.append(ids)
    counts = np.fromiter(map(len, per_shape), np.int64, len(per_shape))
    numbers = np.concatenate(per_shape) if per_shape else np.zeros(0, dtype=np.int64)
    first = np.full(len(known.number), len(numbers), dtype=np.int64)  # each row's first plan here
    np.minimum.at(first, numbers, np.arange(len(numbers)))
    seen = np.flatnonzero(first < len(numbers))
    order = seen[np.argsort(first[seen], kind="stable")]  # this table's rows, in the order first seen
    local = np.empty(len(known.number), dtype=np.int64)
    local[order] = np.arange(len(order))
    rows = list(known.number)
    shape_factor = Factor(SHAPE_FIELDS, list(layouts), np.repeat(np.arange(len(layouts)), counts))
    return PlanTable([shape_factor, Factor(OPTION_FIELDS, [rows[g] for g in order.tolist()], local[numbers])])


def layout_options(
    model: ModelSpec,
    shape: Shape,
    memory: list[tuple[ZeroStage, RecomputeName, OffloadName]],
    fix: Mapping[str, Any],
    gpus_per_node: int,
    precs: tuple[PrecisionName, ...],
) -> list[tuple[Any, ...]]:
    """The (prec, zero, ckpt, offload, hsdp, fp8ag) options of the plans of ``shape``, in
    enumeration order: each precision its shape allows (simulator.plan.fp8_shape_errors), each
    of the ``memory`` options (:func:`memory_options`) its schedule runs with, but no ZeRO stage
    without effect unless pinned (Plan.zero_without_effect: one rank holds the weights), then hybrid
    sharding (:func:`hsdp_options`) and fp8 parameters (:func:`fp8_param_options`)."""
    fp8ag = "fp8ag" in fix
    out = []
    for pr in precs:
        if pr != "bf16" and fp8_shape_errors(model, Plan(t=shape.t, mb=shape.mb, prec=pr, cp=shape.cp)):
            continue
        for zero, ckpt, off in memory:
            if shape.schedule in ZERO_BUBBLE_SCHEDULES and not _zero_bubble_ok(zero):
                continue
            plan = plan_of(shape, zero, ckpt, off, pr)
            if plan.zero_without_effect and "zero" not in fix:  # ZeRO 0's twin, never better
                continue
            for q in hsdp_options(plan, gpus_per_node, fix):
                for r in fp8_param_options(q, fix) if fp8ag or q.prec == "fp8" else (q,):
                    out.append((r.prec, r.zero, r.ckpt, r.offload, r.hsdp, r.fp8ag))
    return out


def fp8_param_options(plan: Plan, fix: Mapping[str, Any]) -> list[Plan]:
    """An fp8 plan with a sharded optimizer or FSDP and no offload with fp8 parameters
    (simulator.plan.fp8_param_errors); ``fp8ag`` pinned: only plans that take that value."""
    can = plan.prec == "fp8" and plan.zero >= 1 and plan.offload == "none"
    want = fix.get("fp8ag", 1 if can else 0)
    if want == 0:
        return [plan]
    return [plan.replace(fp8ag=1)] if can and want == 1 else []


def hsdp_options(plan: Plan, gpus_per_node: int, fix: Mapping[str, Any]) -> list[Plan]:
    """The plan with full sharding, and with hybrid sharding whose shard group fills one node
    (hsdp = gpus_per_node / t: what large FSDP users run, NVLink inside, replicas across) when
    that divides d, for ZeRO-2/3 without offload; ``hsdp`` pinned: only that value."""
    if "hsdp" in fix:
        want = fix["hsdp"]
        if want == 0:
            return [plan]
        return [plan.replace(hsdp=want)] if _hybrid_ok(want, plan.zero, plan.grad_group, plan.offload, plan.ep) else []
    n = gpus_per_node // plan.t if gpus_per_node and gpus_per_node % plan.t == 0 else 0
    ok = n and _hybrid_ok(n, plan.zero, plan.grad_group, plan.offload, plan.ep)
    return [plan, plan.replace(hsdp=n)] if ok else [plan]


@functools.lru_cache(maxsize=8)
def _zero_bubble_ok(zero: int) -> bool:
    """Whether the zero-bubble schedule runs with this ZeRO stage (simulator.plan.zero_bubble_errors;
    the shapes it is enumerated for have p >= 2)."""
    return not zero_bubble_errors(Plan(p=2, zero=zero, schedule="zbh1"))


@functools.lru_cache(maxsize=1024)
def _hybrid_ok(hsdp: int, zero: int, d: int, offload: OffloadName, ep: int = 1) -> bool:
    """Whether hybrid sharding over ``hsdp`` of the ``d`` ranks holding the same weights keeps the
    plan rules (simulator.plan.hsdp_errors); cached: the search asks for the same few combinations
    tens of thousands of times."""
    return not hsdp_errors(Plan(d=d, zero=zero, offload=offload, hsdp=hsdp, ep=ep))
