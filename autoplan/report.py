"""Human-readable tables for simulate and plan results (plain text, fixed-width)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A fixed-width table: numbers right-aligned, text left-aligned."""
    rows = [[_cell(x) for x in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str], raw: Sequence[Any] | None = None) -> str:
        out = []
        for i, c in enumerate(cells):
            numeric = raw is not None and isinstance(raw[i], (int, float)) and not isinstance(raw[i], bool)
            out.append(c.rjust(widths[i]) if numeric else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r, r) for r in rows])


def _cell(x: Any) -> str:
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        if abs(x) >= 1:
            return f"{x:.2f}"
        return f"{x:.3f}"
    return str(x)


def plan_label(plan: dict[str, Any]) -> str:
    cp = f"cp={plan['cp']}," if plan.get("cp", 1) > 1 else ""
    ep = f",ep={plan['ep']}" if plan.get("ep", 1) > 1 else ""
    s = f"t={plan['t']},{cp}p={plan['p']},d={plan['d']}{ep},mb={plan['mb']},zero={plan['zero']},ckpt={plan['ckpt']}"
    if plan.get("v", 1) > 1 or plan.get("schedule") != "1f1b":
        s += f",{plan['schedule']}" + (f",v={plan['v']}" if plan.get("v", 1) > 1 else "")
    if plan.get("sp"):
        s += ",sp=1"
    if plan.get("offload", "none") != "none":
        s += f",offload={plan['offload']}"
    if plan.get("hsdp"):
        s += f",hsdp={plan['hsdp']}"
    if plan.get("prec", "bf16") != "bf16":
        s += f",prec={plan['prec']}"
    if plan.get("fp8ag"):
        s += ",fp8ag=1"
    return s


ATTENTION_TEXT = {
    "flash": "flash (fused kernel, no s x s scores kept: torch SDPA / FlashAttention)",
    "materialized": "materialized (s x s scores, softmax and dropout kept for backward)",
}


def _published_note(r: dict[str, Any]) -> str:
    """The best published MFU of the GPU class beside the prediction, flagged when exceeded."""
    best = r.get("published_best_mfu")
    if not best:
        return ""
    flag = "  ABOVE every published run: check the plan" if r["mfu"] > best["mfu"] else ""
    return f"  (best published on {best['gpu']}: {100 * best['mfu']:.1f}%, {best['run']}){flag}"


#: a pipeline bubble above this share of the ideal (bubble-free) time is warned about
BUBBLE_WARN = 1.0


def bubble_warning(r: dict[str, Any]) -> str | None:
    """The warning for a result whose pipeline idles more than it computes: a bubble above
    :data:`BUBBLE_WARN` of the ideal time, or fewer microbatches than stages; None otherwise."""
    m, p = r["plan"]["num_microbatches"], r["plan"]["p"]
    if r["bubble_fraction"] <= BUBBLE_WARN and m >= p:
        return None
    return (
        f"autoplan: the pipeline bubble is {100 * r['bubble_fraction']:.0f}% of the ideal time: {m} "
        f"microbatch{'es' if m != 1 else ''} per pipeline for p={p} stages, so each stage waits for the others "
        "most of the step; a larger --global-batch (more microbatches) or fewer GPUs would fill it"
    )


def format_result(r: dict[str, Any]) -> str:
    """The simulate report: headline metrics, then time and memory breakdowns."""
    plan = r["plan"]
    fit = "fits" if r["fits"] else "DOES NOT FIT"
    if "memory_headroom_gib" in r:
        fit += f"; {r['memory_headroom_gib']:.1f} GiB more left free: --memory-headroom"
    head = [
        f"{r['model']} on {r['cluster']} ({r['gpus']} GPUs), global batch {r['global_batch']} x {r['seq_length']} tokens",
        f"plan      {plan_label(plan)}  (m={plan['num_microbatches']} microbatches per pipeline)",
        f"framework {r.get('runtime', '')}  (autoplan/frameworks/profiles; --framework)",
        f"fidelity  {r['fidelity']}" + (f"  ({r['fidelity_reason']})" if r.get("fidelity_reason") else ""),
        "",
        f"step time        {r['step_time_s']:.4g} s      tokens/s  {r['tokens_per_s']:,.0f}",
        f"TFLOP/s per GPU  {r['tflops_per_gpu']:.1f}        MFU       {100 * r['mfu']:.1f}%{_published_note(r)}",
        f"attention        {ATTENTION_TEXT.get(r.get('attention', ''), r.get('attention', ''))}",
        f"peak memory      {r['peak_memory_gib']:.2f} / {r['memory_capacity_gib']:.2f} GiB usable  ({fit})",
        f"bubble           {100 * r['bubble_fraction']:.1f}% of the ideal pipeline time",
    ]
    if r.get("bottleneck_link"):
        b = r["bottleneck_link"]
        head.append(
            f"busiest link     {b.get('link', b)} ({100 * b.get('utilization', 0):.0f}% busy)"
            if isinstance(b, dict)
            else f"busiest link     {b}"
        )
    step = r["step_time_s"] or 1.0
    unused = {key for key, dim in (("cp_comm", "cp"), ("ep_comm", "ep")) if r["plan"].get(dim, 1) == 1}
    times = table(
        ["time", "seconds", "share"],
        [(k, v, f"{100 * v / step:.1f}%") for k, v in r["time_breakdown_s"].items() if k not in unused],
    )
    total = sum(r["memory_breakdown_gib"].values()) or 1.0
    mem = table(
        ["memory", "GiB", "share"], [(k, v, f"{100 * v / total:.1f}%") for k, v in r["memory_breakdown_gib"].items()]
    )
    return "\n".join(head) + "\n\n" + _side_by_side(times, mem)


def _side_by_side(a: str, b: str, gap: int = 6) -> str:
    la, lb = a.splitlines(), b.splitlines()
    w = max(len(x) for x in la)
    n = max(len(la), len(lb))
    la += [""] * (n - len(la))
    lb += [""] * (n - len(lb))
    return "\n".join((x.ljust(w + gap) + y).rstrip() for x, y in zip(la, lb))


def _best_plan_lines(found: dict[str, Any]) -> list[str]:
    """The best plan in full, its plan string, and the node count it chose if not the given one."""
    best = found["best"]
    lines = [format_result(best), ""]
    lines.append(f"plan string: {best['plan_string']}")
    if best["nodes"] != found["nodes_given"]:
        lines.append(
            f"nodes: {best['nodes']} of the {found['nodes_given']} given (the {found['objective']} objective's "
            f"choice); simulate or emit this plan with --nodes {best['nodes']}"
        )
    return lines


def _top_plans_table(top: list[dict[str, Any]]) -> str:
    """The top plans, one row each: size, speed, memory, bubble, time split and cost."""
    rows = []
    for r in top:
        tb = r["time_breakdown_s"]
        step = r["step_time_s"]
        rows.append(
            (
                plan_label(r["plan"]) + _partition_note(r["plan"]),
                r["gpus"],
                step,
                r["tokens_per_s"],
                r["tflops_per_gpu"],
                f"{100 * r['mfu']:.1f}%",
                f"{r['peak_memory_gib']:.1f}/{r['memory_capacity_gib']:.0f}",
                f"{100 * r['bubble_fraction']:.1f}%",
                " ".join(f"{k[:4]}={100 * v / step:.0f}%" for k, v in tb.items() if v > 0.005 * step),
                round(r["cost_gpu_hours_per_mtok"], 3),
            )
        )
    return table(
        ["plan", "gpus", "step s", "tokens/s", "TFLOP/s", "MFU", "mem GiB", "bubble", "time split", "GPU-h/Mtok"],
        rows,
    )


def _partition_table(partition: list[dict[str, Any]]) -> str:
    """The partition's gains: each uniform plan beside its optimized layer split."""
    return table(
        ["uniform plan", "optimized layers / recompute", "uniform s", "optimized s", "gain"],
        [
            (
                plan_label(_plan_dict(g["uniform"])),
                _layers_part(g["optimized"]),
                g["uniform_step_time_s"],
                g["optimized_step_time_s"],
                f"{g['gain_pct']:.1f}%",
            )
            for g in partition
        ],
    )


def format_plan_report(found: dict[str, Any]) -> str:
    """The plan report: the best plan in full, the top plans, the partition gain, the Pareto set."""
    best = found["best"]
    lines = _best_plan_lines(found)
    lines.append("")
    lines.append(f"top plans ({found['objective']} objective; {best['fidelity']} fidelity):")
    lines.append(_top_plans_table(found["top"]))
    if found.get("partition"):
        lines.append("")
        lines.append("layer partition / recompute vs the uniform split:")
        lines.append(_partition_table(found["partition"]))
    lines.append("")
    lines.append("time vs memory Pareto set (analytic):")
    lines.append(
        table(
            ["plan", "gpus", "step s", "peak GiB"],
            [(p["plan"], p["gpus"], p["step_time_s"], p["peak_memory_gib"]) for p in found["pareto"]],
        )
    )
    lines.append("")
    lines.append(
        f"searched {found['candidates_total']:,} plans ({found['candidates_feasible']:,} fit), "
        f"simulated {found['candidates_simulated']} in {found['search_time_s']:.1f} s"
    )
    return "\n".join(lines)


def _plan_dict(plan_string: str) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for item in plan_string.split(","):
        k, _, v = item.partition("=")
        d[k] = int(v) if v.isdigit() else v
    return d


def _partition_note(plan: dict[str, Any]) -> str:
    return " +partition" if plan.get("layers") or plan.get("recompute") else ""


def _layers_part(plan_string: str) -> str:
    """The layers=/recompute= part of a plan string, runs compressed: 1/1/1/41 -> 1x3/41; without
    either (the refinement only lightened the recomputation of every layer), its ckpt= part."""
    parts = [x for x in plan_string.split(",") if x.startswith(("layers=", "recompute="))]
    if not parts:
        return next(x for x in plan_string.split(",") if x.startswith("ckpt="))
    return ",".join(k + "=" + _runs(v.split("/")) for k, _, v in (x.partition("=") for x in parts))


def _runs(items: list[str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[i]:
            j += 1
        out.append(items[i] if j == i else f"{items[i]}x{j - i + 1}")
        i = j + 1
    return "/".join(out)
