"""The gallery's validation picture (docs/images/validation.png) and tables: notebooks/03_validation.ipynb,
condensed; Megatron-LM's published 2021 rows against the analytic model and the DES, and the vTrain runs against
the analytic model, error per point."""

from __future__ import annotations

import sys

from .docs_runner import REPO, Docs, fence
from .gallery_plotting import error_axes, identity_axes, pyplot, save_figure

VTRAIN_GROUP_STYLE = {  # group: (colour, marker size)
    "single node, fit subset": ("#BBBBBB", 5),
    "single node, held out": ("#4C72B0", 7),
    "multi-node (64-512 GPUs)": ("#C44E52", 14),
}


def gallery_validation(d: Docs) -> str:
    """notebooks/03_validation.ipynb, condensed: Megatron-LM rows and the vTrain runs, error per point."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _accuracy_data as data

    if not (data.VALIDATION_DIR / "published.yaml").is_file():
        raise SystemExit(
            f"make_docs: the validation data is not at {data.VALIDATION_DIR} (set AUTOPLAN_VALIDATION_DIR)"
        )
    plt = pyplot()
    mega = _megatron_predictions(data)
    groups = _vtrain_predictions(data)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), dpi=90, gridspec_kw={"width_ratios": [1.1, 1, 1.1]})
    _draw_megatron_bars(axes[0], mega)
    _draw_vtrain_points(axes[1], axes[2], groups)
    for ax in axes:
        ax.grid(alpha=0.3)
    save_figure(plt, fig, "validation.png")
    return fence(_megatron_table(mega) + "\n\n" + _vtrain_table(groups))


def _error_pct(pred: float, ref: float) -> float:
    return 100.0 * (pred / ref - 1.0)


def _megatron_predictions(data) -> list[tuple]:
    """(published row, analytic estimate, DES result) per Megatron-LM row, each job as the sc21 script ran it."""
    from simulator import analytic, simulate

    mega = []
    for row in data.published_rows():
        job = data.published_as_run(row)  # Megatron-LM's sc21 script: the row's mb, schedule and DDP
        mega.append((row, analytic.estimate(job), simulate(job, "des")))
    return mega


def _vtrain_predictions(data) -> dict[str, list[tuple[float, float]]]:
    """(measured, predicted) iteration times of the vTrain runs per group of VTRAIN_GROUP_STYLE."""
    from simulator import analytic

    groups: dict[str, list[tuple[float, float]]] = {group: [] for group in VTRAIN_GROUP_STYLE}
    for name in data.VTRAIN_FILES:
        for r in data.vtrain_rows(name):
            pred = analytic.estimate(r.job).step_time  # as autoplan simulate --framework megatron --no-dp-overlap
            g = (
                "multi-node (64-512 GPUs)"
                if "multi" in name
                else ("single node, fit subset" if r.fit_subset else "single node, held out")
            )
            groups[g].append((r.measured_s, pred))
    return groups


def _draw_megatron_bars(ax, mega: list[tuple]) -> None:
    """Published and predicted TFLOP/s per GPU side by side per row, the error written over each prediction."""
    x = range(len(mega))
    labels = [f"{row.params_B:g}B\n{row.gpus} GPUs" for row, _, _ in mega]
    ax.bar([i - 0.2 for i in x], [row.tflops_per_gpu for row, _, _ in mega], 0.4, color="#8C8C8C", label="published")
    ax.bar(
        [i + 0.2 for i in x], [b.tflops_per_gpu for _, b, _ in mega], 0.4, color="#4C72B0", label="autoplan (analytic)"
    )
    for i, (row, b, _) in enumerate(mega):
        ax.text(
            i + 0.2,
            b.tflops_per_gpu + 3,
            f"{_error_pct(b.tflops_per_gpu, row.tflops_per_gpu):+.1f}%",
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set(ylabel="TFLOP/s per GPU", title="Megatron-LM 2021 on Selene: published vs predicted", ylim=(0, 215))
    ax.legend(fontsize=8, loc="lower right")


def _draw_vtrain_points(identity_ax, error_ax, groups: dict[str, list[tuple[float, float]]]) -> None:
    """The vTrain runs, predicted vs measured (with each group's MAPE) and error per run."""
    for g, pts in groups.items():
        color, size = VTRAIN_GROUP_STYLE[g]
        mape = 100 * sum(abs(p / m - 1) for m, p in pts) / len(pts)
        identity_ax.scatter(
            [m for m, _ in pts],
            [p for _, p in pts],
            s=size,
            color=color,
            alpha=0.7,
            label=f"{g}: {len(pts)}, MAPE {mape:.1f}%",
        )
        error_ax.scatter(
            [m for m, _ in pts], [_error_pct(p, m) for m, p in pts], s=size, color=color, alpha=0.7, label=g
        )
    identity_axes(
        identity_ax,
        (0.05, 100),
        0.1,
        "measured iteration time (s)",
        "predicted iteration time (s)",
        "vTrain: 1,549 measured A100 runs (dotted: ±10%)",
    )
    error_axes(error_ax, "measured iteration time (s)", "vTrain: error per run (band: ±10%)")


def _megatron_table(mega: list[tuple]) -> str:
    """Per Megatron-LM row: the job as run, published and predicted TFLOP/s per GPU (analytic and DES), errors."""
    from autoplan.report import table

    return table(
        [
            "model",
            "GPUs",
            "t",
            "p",
            "batch",
            "as run (sc21 script)",
            "published TFLOP/s",
            "predicted",
            "error",
            "DES",
            "error",
        ],
        [
            (
                f"{row.params_B:g}B",
                row.gpus,
                row.t,
                row.p,
                row.batch,
                f"mb={b.job.plan.mb} {b.job.plan.schedule}" + (f" v={b.job.plan.v}" if b.job.plan.v > 1 else ""),
                row.tflops_per_gpu,
                b.tflops_per_gpu,
                f"{_error_pct(b.tflops_per_gpu, row.tflops_per_gpu):+.1f}%",
                des.tflops_per_gpu,
                f"{_error_pct(des.tflops_per_gpu, row.tflops_per_gpu):+.1f}%",
            )
            for row, b, des in mega
        ],
    )


def _vtrain_table(groups: dict[str, list[tuple[float, float]]]) -> str:
    """Per vTrain group: run count, MAPE and the share within 10%."""
    from autoplan.report import table

    return table(
        ["vTrain runs", "count", "MAPE", "within 10%"],
        [
            (
                g,
                len(pts),
                f"{100 * sum(abs(p / m - 1) for m, p in pts) / len(pts):.1f}%",
                f"{100 * sum(abs(p / m - 1) <= 0.1 for m, p in pts) / len(pts):.0f}%",
            )
            for g, pts in groups.items()
        ],
    )
