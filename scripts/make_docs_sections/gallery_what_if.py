"""The gallery's what-if picture (docs/images/what-if-scaling.png) and table: notebooks/02_what_if.ipynb's first
figure, condensed, the planner's best plan for llama2-70b on three kinds of node from 16 to 1,024 GPUs."""

from __future__ import annotations

import os
import time

from .docs_runner import Docs, fence, log
from .gallery_plotting import pyplot, save_figure

WHAT_IF_NODES = {
    "dgx-a100-80gb": ("DGX A100 80GB (NVSwitch, 8x200 Gb/s IB)", "#4C72B0"),
    "dgx-h100": ("DGX H100 (NVSwitch, 8x400 Gb/s IB)", "#55A868"),
    "pcie-a100-80gb": ("A100 PCIe, no NVLink (2x200 Gb/s IB)", "#C44E52"),
}
WHAT_IF_NUDGE = {"dgx-a100-80gb": (0.92, True), "dgx-h100": (1.0, False), "pcie-a100-80gb": (1.08, False)}
WHAT_IF_GPUS = [16, 32, 64, 128, 256, 512, 1024]
WHAT_IF_MODEL, WHAT_IF_BATCH = "llama2-70b", 1024
WHAT_IF_FRAMEWORK = "megatron"  # the hardware compared under one stack: --framework megatron
TABLE_GPUS = (16, 128, 1024)


def gallery_what_if(d: Docs) -> str:
    """notebooks/02_what_if.ipynb's first figure, condensed: the planner's best plan per cluster size."""
    from autoplan.report import table

    plt = pyplot()
    best = _best_per_cluster_size()
    _draw_what_if(plt, best)
    return fence(table(["node", "GPUs", "best plan (analytic)", "tokens/s", "MFU"], _best_plan_rows(best)))


def _best_per_cluster_size() -> dict[tuple[str, int], object]:
    """The analytic search's best result per (node, GPU count), None where no plan fits."""
    from autoplan.frameworks import load_framework
    from autoplan.search import NoPlanFits, SearchOptions, search
    from hwprofiles.load import load_cluster
    from simulator.model_files import load_model

    model = load_model(WHAT_IF_MODEL)
    stack = load_framework(WHAT_IF_FRAMEWORK)
    opts = SearchOptions(  # bf16 everywhere: the hardware compared at one precision (fp8 runs on H100 only)
        fix="prec=bf16",
        fidelity="analytic",
        top=1,
        max_finalists=1,
        partition=False,
        jobs=os.cpu_count() or 1,
        framework=stack,
        runtime=stack.base_runtime(),
    )
    t0 = time.perf_counter()
    best: dict[tuple[str, int], object] = {}
    for node in WHAT_IF_NODES:
        per_node = load_cluster(node).gpus_per_node
        for g in WHAT_IF_GPUS:
            try:
                best[node, g] = search(model, load_cluster(node, nodes=g // per_node), WHAT_IF_BATCH, opts).best_result
            except NoPlanFits:
                best[node, g] = None
    log(f"  what-if sweep: {len(best)} searches in {time.perf_counter() - t0:.1f} s")
    return best


def _draw_what_if(plt, best: dict) -> None:
    """Throughput, MFU and the chosen t x p against the GPU count, one line per node; saved as what-if-scaling.png."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), dpi=90)
    for node, (label, color) in WHAT_IF_NODES.items():
        _plot_node(axes, node, label, color, [(g, best[node, g]) for g in WHAT_IF_GPUS if best[node, g] is not None])
    axes[0].set(
        yscale="log",
        ylabel="predicted tokens/s (whole cluster)",
        title=f"throughput (global batch {WHAT_IF_BATCH} x 4096 tokens)",
    )
    axes[1].set(ylabel="MFU (%)", title="model FLOPs utilization", ylim=(0, 100))
    axes[2].set(
        yscale="log",
        ylabel="model-parallel size t x p",
        title="chosen plan (z = ZeRO stage, +off = CPU offload)",
        ylim=(0.7, 16),
    )
    axes[2].set_yticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    for ax in axes:
        ax.set(xscale="log", xlabel="GPUs")
        ax.set_xticks(WHAT_IF_GPUS, [str(g) for g in WHAT_IF_GPUS])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"What if: {WHAT_IF_MODEL} on three kinds of node, 16 to 1,024 GPUs (autoplan plan --fidelity analytic)"
    )
    save_figure(plt, fig, "what-if-scaling.png")


def _plot_node(axes, node: str, label: str, color: str, pts: list) -> None:
    """One node's line on each of the three axes, its chosen plans written next to the points of the third."""
    xs = [g for g, _ in pts]
    axes[0].plot(xs, [r.tokens_per_s for _, r in pts], "o-", color=color, label=label)
    axes[1].plot(xs, [100 * r.mfu for _, r in pts], "o-", color=color, label=label)
    # nudged apart vertically (x0.92, x1, x1.08) so that equal choices stay visible
    nudge, below = WHAT_IF_NUDGE[node]
    axes[2].plot(xs, [r.job.plan.t * r.job.plan.p * nudge for _, r in pts], "o-", color=color, label=label)
    for g, r in pts:
        p = r.job.plan
        axes[2].annotate(
            f"t{p.t}p{p.p} z{p.zero}" + ("+off" if p.offload != "none" else ""),
            (g, p.t * p.p * nudge),
            textcoords="offset points",
            xytext=(0, -11 if below else 5),
            ha="center",
            fontsize=6.5,
            color=color,
        )


def _best_plan_rows(best: dict) -> list[tuple]:
    """The table's rows: the best plan per node at 16, 128 and 1,024 GPUs (defaults dropped from the plan string)."""
    rows: list[tuple] = []
    for (node, g), r in best.items():
        if g in TABLE_GPUS:
            rows.append(
                (node, g, "no plan fits")
                if r is None
                else (
                    node,
                    g,
                    r.job.plan.to_string().replace(",v=1,schedule=1f1b", "").replace(",offload=none", ""),
                    round(r.tokens_per_s),
                    f"{100 * r.mfu:.1f}%",
                )
            )
    return rows
