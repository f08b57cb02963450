"""What one exporter produces for one tool: its files, the plan they run, and every difference.

An exporter either writes files that make its tool run the plan exactly, or (when the tool
cannot express part of the plan) the *closest runnable plan*, each change named with its reason
(:class:`Change`), or nothing, with the reason (:attr:`Export.refused`). Facts that do not change
the plan but change what the tool does (Megatron keeping gradients on the GPU under CPU offload)
are :attr:`Export.notes`. Nothing is dropped silently: ``autoplan emit`` prints all of it and
the files carry it in their header.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal, get_args

from autoplan.emit.safe_text import docstring_lines
from simulator.cost.schedules import rank_chunks
from simulator.job import Job
from simulator.plan import Plan, plan_errors

Target = Literal["torch", "megatron", "deepspeed", "torchtitan"]
TARGETS: tuple[Target, ...] = get_args(Target)


@dataclass(frozen=True)
class Change:
    """One way the written plan departs from the requested one: ``key`` from ``planned`` to ``written``."""

    key: str
    planned: str
    written: str
    why: str

    def describe(self) -> str:
        return f"{self.key}={self.planned} -> {self.key}={self.written}: {self.why}"


@dataclass(frozen=True)
class Export:
    """One tool's share of a run dir (``files``: name -> text) and how it relates to the plan."""

    target: Target
    release: str
    files: dict[str, str] = field(default_factory=dict)
    written: Plan | None = None  # the plan the files run (None: nothing written)
    changes: tuple[Change, ...] = ()
    notes: tuple[str, ...] = ()
    refused: str | None = None

    @property
    def exact(self) -> bool:
        return self.refused is None and not self.changes


def refuse(target: Target, release: str, why: str) -> Export:
    return Export(target=target, release=release, refused=why)


@dataclass
class Draft:
    """An exporter's decisions before it renders files: the plan updates (each a :class:`Change`)
    and the notes."""

    job: Job
    updates: dict[str, Any] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def change(self, key: str, written: Any, why: str, **also: Any) -> None:
        """Write ``key=written`` instead of the plan's value (and the ``also`` keys with it)."""
        planned = getattr(self.job.plan, key)
        self.changes.append(Change(key, _text(planned), _text(written), why))
        self.updates.update({key: written, **also})

    def change_recompute(self, ckpt: str, recompute: tuple[tuple[int, int], ...] | None, why: str) -> None:
        """Recompute (full, selective) layers per chunk as ``ckpt`` / ``recompute`` say instead."""
        n = self.job.model.num_layers
        before = self.plan().chunk_recompute(n)
        self.updates.update(ckpt=ckpt, recompute=recompute)
        after = self.plan().chunk_recompute(n)
        if after != before:
            self.changes.append(Change("recompute", _text(before), _text(after), why))

    def plan(self) -> Plan:
        """The plan as updated so far (:meth:`finish` checks it)."""
        return self.job.plan.replace(**self.updates) if self.updates else self.job.plan

    def finish(self, target: Target, release: str, render: Callable[[Plan, list[str]], dict[str, str]]) -> Export:
        """Check the closest plan against autoplan's plan rules (:func:`simulator.plan.plan_errors`)
        and render its files with ``render(plan, header)``; a plan that breaks a rule is refused."""
        written = self.plan()
        errors = plan_errors(self.job.model, written, self.job.plan.gpus, self.job.global_batch)
        if errors:
            named = "; ".join(c.describe() for c in self.changes)
            return refuse(target, release, f"the closest plan it runs ({named}) breaks a plan rule: {errors[0]}")
        header = [f"autoplan emit for {release}: model {self.job.model.name}, plan {self.job.plan.to_string()}"]
        if self.changes:
            header.append(f"NOT the plan as given: this runs {written.to_string()}")
            header += [f"  changed {c.describe()}" for c in self.changes]
        header += [f"note: {n}" for n in self.notes]
        files = render(written, header)
        return Export(target, release, files, written, tuple(self.changes), tuple(self.notes))


TEMPLATE_BLOCK = ("# ---- the plan (autoplan emit writes these values) ----", "# ---- end of the plan ----")


def fill_template(name: str, values: dict[str, str], header: list[str]) -> str:
    """A shipped template (``autoplan/emit/templates/<name>``, a module checked like the rest of the
    code) with its plan block replaced by ``NAME = value`` lines (``values``: name -> Python source;
    an annotation may lead the name, ``"STAGES: tuple[int, ...]"``) and ``header`` after its
    docstring's first line (:func:`autoplan.emit.safe_text.docstring_lines`)."""
    text = resources.files("autoplan.emit").joinpath("templates", name).read_text()
    start, end = text.index(TEMPLATE_BLOCK[0]), text.index(TEMPLATE_BLOCK[1])
    lines = [TEMPLATE_BLOCK[0], *(f"{k} = {v}" for k, v in values.items()), ""]
    text = text[:start] + "\n".join(lines) + text[end:]
    first = text.index("\n") + 1
    return text[:first] + "\n" + docstring_lines(header) + "\n" + text[first:]


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(_text(v) if not isinstance(v, tuple) else ":".join(map(str, v)) for v in value)
    return "none" if value is None else str(value)


def one_stage_per_rank(plan: Plan, num_layers: int) -> dict[str, Any]:
    """The updates that turn a plan of v chunks per pipeline rank (interleaved, or ZB-V's V) into
    one 1F1B stage per rank with the same layers per rank: rank r's chunks (r, r+p, ...; or r and
    2p-1-r) become one stage of as many layers (and recomputed layers), for tools without them."""
    chunks = plan.chunk_layers(num_layers)
    rec = plan.chunk_recompute(num_layers)
    mine = rank_chunks(plan.schedule, plan.p, plan.v)
    layers = tuple(sum(chunks[c] for c in cs) for cs in mine)
    recompute = tuple((sum(rec[c][0] for c in cs), sum(rec[c][1] for c in cs)) for cs in mine)
    return {
        "v": 1,
        "schedule": "1f1b",
        "layers": None if plan.layers is None and len(set(layers)) == 1 else layers,
        "recompute": None if plan.recompute is None else recompute,
    }
