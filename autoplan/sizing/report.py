"""The sweep's table and its picture: time to train against its cost, the Pareto frontier and
the chosen size (``autoplan plan --nodes A:B``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan.report import table

#: plan keys the table leaves out at these values (the plan string lists every key)
_DEFAULTS = {"v": "1", "offload": "none", "sp": "0", "cp": "1", "ep": "1", "prec": "bf16", "hsdp": "0"}


def short_plan(plan: str) -> str:
    """``plan`` without the keys at their plain values (v=1, offload=none, ...)."""
    keep = [kv for kv in plan.split(",") if _DEFAULTS.get(kv.split("=")[0]) != kv.split("=")[1]]
    return ",".join(keep)


def _money(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def format_sweep(d: dict[str, Any]) -> str:
    """The sweep (autoplan.sizing.sweep.Sweep.to_dict) as a table, one row per size, the choice
    marked ``*``, then what was skipped and what was chosen."""
    goal, choice = d["goal"], d["choice"]
    tokens = goal["tokens"] is not None
    headers = ["", "nodes", "GPUs", "best plan", "step s", "tokens/s", "MFU", "MTBF h", "goodput"]
    if tokens:
        headers += ["days", "GPU-hours"] + (["cost"] if goal["price"] is not None else [])
    rows = []
    for r in d["sizes"]:
        mark = "*" if choice and r["nodes"] == choice["nodes"] else ""
        row = [mark, r["nodes"], r["gpus"], short_plan(r["plan"]), f"{r['step_time_s']:.2f}"]
        row += [
            f"{r['tokens_per_s']:,.0f}",
            f"{100 * r['mfu']:.1f}%",
            f"{r['mtbf_h']:.1f}",
            f"{100 * r['goodput']:.1f}%",
        ]
        if tokens:
            late = " (late)" if r["meets_deadline"] is False else ""
            row += [f"{r['days_with_failures']:.1f}{late}", f"{r['gpu_hours']:,.0f}"]
            row += [_money(r["cost"])] if goal["price"] is not None else []
        rows.append(row)
    lines = [table(headers, rows)]
    if d["skipped"]:
        lines.append(_skipped_line(d["skipped"]))
    lines.append(_choice_line(d))
    n = len(d["sizes"])
    lines.append(f"planned {n} size{'' if n == 1 else 's'} in {d['search_time_s']:.1f} s")
    return "\n".join(lines)


#: skipped sizes the table's line names before "and N more" (--json gives every size and reason)
SKIPPED_NAMED = 12


def _skipped_line(skipped: list[dict[str, Any]]) -> str:
    """The sizes no plan can use, the first :data:`SKIPPED_NAMED` named, and the first one's reason."""
    nodes = [str(s["nodes"]) for s in skipped]
    more = len(nodes) - SKIPPED_NAMED
    named = ", ".join(nodes[:SKIPPED_NAMED]) + (f" and {more} more" if more > 0 else "")
    first = skipped[0]
    return (
        f"skipped {len(nodes)} size(s) ({named}; --json gives each reason): {first['nodes']} nodes: {first['reason']}"
    )


def _choice_line(d: dict[str, Any]) -> str:
    goal, c = d["goal"], d["choice"]
    if c is None:
        return f"no size trains {goal['tokens']:.3g} tokens within {goal['deadline_days']:g} days"
    why = "fastest" if goal["objective"] == "time" else "fewest GPU-hours"
    if goal["deadline_days"] is not None:
        why += f" within {goal['deadline_days']:g} days"
    line = f"choice ({why}, interruptions priced in): {c['nodes']} nodes, {c['plan']}"
    if c["days_with_failures"] is not None:
        line += f": {c['days_with_failures']:.1f} days ({c['days']:.1f} without interruptions), {c['gpu_hours']:,.0f} GPU-hours"
        line += f", cost {_money(c['cost'])}" if c["cost"] is not None else ""
    return line + f"; checkpoint every {c['checkpoint_interval_s'] / 60:.0f} min ({c['checkpoint_s']:.0f} s each)"


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (lower is better), in
    ascending order of the first."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def plot_sweep(d: dict[str, Any], path: Path) -> None:
    """Write :func:`sweep_figure` of the sweep ``d`` to ``path`` (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = sweep_figure(d)
    fig.savefig(path)
    plt.close(fig)


def sweep_figure(d: dict[str, Any]) -> Any:
    """Days to train (interruptions priced in) against cost (GPU-hours without a price), every
    size a point labelled with its node count, the Pareto frontier joined, the choice ringed: a
    matplotlib Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    goal, rows = d["goal"], d["sizes"]
    priced = goal["price"] is not None
    xs = [r["cost"] if priced else r["gpu_hours"] for r in rows]
    ys = [r["days_with_failures"] for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    ax.scatter(xs, ys, s=18, color="#8a8a8a", label="a cluster size (its best plan)", zorder=2)
    front = pareto(list(zip(xs, ys)))
    ax.plot(
        [xs[i] for i in front], [ys[i] for i in front], "-o", color="#1f77b4", ms=4, label="Pareto frontier", zorder=3
    )
    for i, r in enumerate(rows):
        ax.annotate(str(r["nodes"]), (xs[i], ys[i]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if d["choice"]:
        c = next(i for i, r in enumerate(rows) if r["nodes"] == d["choice"]["nodes"])
        ax.scatter(
            [xs[c]], [ys[c]], s=160, facecolors="none", edgecolors="#d62728", linewidths=2, label="choice", zorder=4
        )
    if goal["deadline_days"] is not None:
        ax.axhline(
            goal["deadline_days"], color="#d62728", ls="--", lw=1, label=f"deadline {goal['deadline_days']:g} days"
        )
    ax.set_xlabel("cost" if priced else "GPU-hours")
    ax.set_ylabel("days to train (interruptions priced in)")
    ax.set_title(
        f"{goal['tokens']:,.0f} tokens: days to train against cost, each size's node count labelled", fontsize=10
    )
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
