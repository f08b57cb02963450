"""The gallery's FSDP picture (docs/images/validation-fsdp.png) and table: the published FSDP / ZeRO-3 and
Megatron-core rows of benchmarks/_accuracy_fsdp.py, measured against predicted tokens/s per GPU, per source."""

from __future__ import annotations

import sys

from .docs_runner import REPO, Docs, fence
from .gallery_plotting import error_axes, identity_axes, pyplot, save_figure


def gallery_fsdp(d: Docs) -> str:
    """The published FSDP / ZeRO-3 and Megatron-core rows: measured vs predicted tokens/s per GPU
    per source (picture) and the MAPE per source (table)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _accuracy_fsdp as fsdp

    from autoplan.report import table

    plt = pyplot()
    res = fsdp.fsdp_section(False, lambda _line: None)
    pts = res["points"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), dpi=90)
    colors = {"mosaicml_mpt": "#4C72B0", "torchtitan_a100_64gpu": "#DD8452", "dgxc_benchmarking_h100": "#55A868"}
    series = [(source, color, "bf16") for source, color in colors.items()] + [
        (f"{source} fp8", "#222222" if source == "mosaicml_mpt" else "#8172B3", "fp8")
        for source in ("mosaicml_mpt", "dgxc_benchmarking_h100")
    ]
    for name, color, prec in series:
        source = name.removesuffix(" fp8")
        mine = [(r, p) for r, p in pts if r.source == source and r.job.plan.prec == prec]
        if not mine:
            continue
        st = res["sources"][name]
        label = f"{name}: {len(mine)} runs, MAPE {st['mape']:.1f}%"
        axes[0].scatter([r.tok_s_gpu for r, _ in mine], [p for _, p in mine], s=14, color=color, label=label)
        axes[1].scatter(
            [r.job.model.seq_length for r, _ in mine], [100 * (p / r.tok_s_gpu - 1) for r, p in mine], s=14, color=color
        )
    identity_axes(
        axes[0],
        (100, 300_000),
        0.2,
        "published tokens/s per GPU",
        "predicted tokens/s per GPU",
        f"published-fsdp.yaml: {len(pts)} runs (dotted: ±20%)",
    )
    error_axes(axes[1], "sequence length", "error per run (band: ±10%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    save_figure(plt, fig, "validation-fsdp.png")
    body = table(
        ["published-fsdp.yaml source", "rows", "MAPE", "mean", "range"],
        [
            (src, st["n"], f"{st['mape']:.1f}%", f"{st['mean']:+.1f}%", f"{st['min']:+.1f}% .. {st['max']:+.1f}%")
            for src, st in res["sources"].items()
        ],
    )
    note = (
        f"bf16: {res['within_20']} of {res['rows']} runs within 20%; {len(res['oom'])} predicted out of memory "
        f"(counted as misses); {res['skipped']} rows skipped (ZeRO stage or recomputation not stated)"
    )
    return fence(body + "\n" + note)
