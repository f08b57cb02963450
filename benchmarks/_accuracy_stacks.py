"""The accuracy benchmark's closing views (benchmarks/accuracy.py): every predicted row's error under
the framework that ran it, summarized per stack (MAPE, mean signed error, worst row); the
``autoplan simulate`` command of any row (``--command TEXT``); each section's headline against
its target.

Errors are of throughput, predicted over measured minus one: positive where autoplan predicts
the run faster than it ran (a vTrain row's step-time error is turned around to match).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import _accuracy_data as data
import _accuracy_fsdp as fsdp
from _accuracy_cli import RowCommand, RowError


def stack_summary(rows: list[RowError], out: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """Per stack (and per source within it): rows, MAPE, mean signed error, and the worst row."""
    out(
        "Per stack (throughput error, predicted vs measured: + predicted faster; --command TEXT prints a row's command)"
    )
    res: dict[str, dict[str, float]] = {}
    for stack in dict.fromkeys(r.stack for r in rows):
        mine = [r for r in rows if r.stack == stack]
        for group, members in [(stack, mine), *_by_source(mine)]:
            errs = [r.error for r in members]
            worst = max(members, key=lambda r: abs(r.error))
            mape, mean = sum(map(abs, errs)) / len(errs), sum(errs) / len(errs)
            if group == stack:
                res[stack] = {"n": len(errs), "mape": mape, "mean": mean, "worst": worst.error}
            out(
                f"  {group:<40} {len(errs):>5} rows  MAPE {mape:>5.1f}%  mean {mean:>+6.1f}%  "
                f"worst {worst.error:>+6.1f}% ({worst.label})"
            )
    return res


def _by_source(rows: list[RowError]) -> list[tuple[str, list[RowError]]]:
    """The rows per source, indented under their stack (only where a stack has several)."""
    sources = list(dict.fromkeys(r.source for r in rows))
    if len(sources) < 2:
        return []
    return [(f"  {s}", [r for r in rows if r.source == s]) for s in sources]


def row_commands() -> Iterator[tuple[str, RowCommand]]:
    """Every predicted row's label and command: Megatron-LM 2021, the published FSDP and
    Megatron-core runs, the vTrain runs."""
    for row in data.published_rows():
        yield (
            f"megatron_2021 {row.params_B}B {row.gpus} GPUs t{row.t} p{row.p} B={row.batch}",
            data.published_command(row),
        )
    for r in fsdp.fsdp_rows():
        if r.command is not None:
            yield f"{r.source} {r.label}", r.command
    for name in data.VTRAIN_FILES:
        for i, raw in enumerate(data.read_csv(name)):
            yield (
                f"vtrain {name} row {i + 2}: " + ", ".join(f"{k}={v}" for k, v in raw.items()),
                data.vtrain_command(raw),
            )


def print_commands(text: str, out: Callable[[str], None], limit: int = 40) -> int:
    """The commands of the rows whose label contains ``text`` (at most ``limit``); how many matched."""
    found = [(label, cmd) for label, cmd in row_commands() if text.lower() in label.lower()]
    for label, cmd in found[:limit]:
        out(f"# {label}")
        out(cmd.shell())
    if len(found) > limit:
        out(f"# ... and {len(found) - limit} more rows match {text!r}")
    if not found:
        out(f"# no row's label contains {text!r}")
    return len(found)


def summary(
    out: Callable[[str], None],
    pub: dict[str, Any],
    vt: dict[str, Any],
    fs: dict[str, Any],
    cpu: dict[str, Any],
    targets: dict[str, float],
) -> None:
    """Every section's headline figure against its target (``targets``, docs/design.md section 7)."""
    single, multi = vt["ground_truth_single.csv"], vt["ground_truth_multi.csv"]
    out("Summary")
    lo, hi = pub["range"]
    both = lo < 0 < hi and pub["mape"] <= targets["published_mape"]
    out(
        f"  published Megatron rows: MAPE {pub['mape']:.1f}%, errors {lo:+.1f}% .. {hi:+.1f}% "
        f"[{'ok' if pub['max'] <= targets['published'] else 'MISSED'}: each <= {targets['published']:.0f}%; "
        f"{'ok' if both else 'MISSED'}: MAPE <= {targets['published_mape']:.0f}% with errors of both signs]"
    )
    out(
        f"  vTrain single-node: MAPE {single['mape']:.1f}% (held out {single['held_out']:.1f}%) "
        f"[{'ok' if single['mape'] <= targets['vtrain'] else 'MISSED'}: <= {targets['vtrain']:.0f}%]"
    )
    out(
        f"  vTrain multi-node:  MAPE {multi['mape']:.1f}% "
        f"[{'ok' if multi['mape'] <= targets['vtrain'] else 'MISSED'}: <= {targets['vtrain']:.0f}%]"
    )
    for source, st in fs["sources"].items():
        out(
            f"  {source}: MAPE {st['mape']:.1f}%, mean {st['mean']:+.1f}%, range {st['min']:+.1f}% .. {st['max']:+.1f}%"
        )
    out(
        f"  published FSDP/ZeRO-3 bf16 rows: MAPE {fs['all']['mape']:.1f}%, {fs['within_20']} of {fs['rows']} within 20%, "
        f"{len(fs['oom'])} predicted out of memory "
        f"[{'ok' if fs['all']['mape'] <= targets['fsdp'] else 'MISSED'}: <= {targets['fsdp']:.0f}%]"
    )
    if fs["fp8"]:
        f8 = fs["fp8"]
        out(f"  published fp8 rows (prec=fp8): MAPE {f8['mape']:.1f}%, range {f8['min']:+.1f}% .. {f8['max']:+.1f}%")
    if cpu.get("ran"):
        out(
            f"  CPU runs: MAPE {cpu['mape']:.1f}%, worst {cpu['max']:.1f}% "
            f"[{'ok' if cpu['max'] <= targets['cpu'] else 'MISSED'}: each <= {targets['cpu']:.0f}%]"
        )
    else:
        out("  CPU runs: not measured")
