"""A matplotlib timeline of a DES run: one lane per pipeline stage, a memory curve under it.

Each stage lane shows its compute stream (colors per task kind: forward, backward,
recompute, TP collectives, optimizer; microbatch numbers on bars wide enough to hold them)
and, in a thin strip below, its communication streams (pipeline sends, data-parallel and
ZeRO collectives, offload). The lower panel draws each stage's memory over the iteration
against the usable capacity. Stages are drawn from the first data-parallel replica and
tensor rank (the symmetric simulation's representatives).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simulator.des.program import Device
from simulator.des.simulate import DesRecord, des_record
from simulator.result import GiB, SimResult

COLORS = {
    "fwd": "#4C72B0",
    "bwd": "#55A868",
    "recompute": "#DD8452",
    "tp": "#8172B3",
    "cp": "#B07AA1",
    "ep": "#76B7B2",
    "opt": "#C44E52",
    "pp": "#937860",
    "dp": "#DA8BC3",
    "zero": "#8C8C8C",
    "offload": "#CCB974",
    "cpu": "#64B5CD",
}
LABELS = {
    "fwd": "forward",
    "bwd": "backward",
    "recompute": "recompute",
    "tp": "TP collective",
    "cp": "CP ring (K/V exchange)",
    "ep": "EP all-to-all (tokens)",
    "opt": "optimizer",
    "pp": "PP send",
    "dp": "DP collective",
    "zero": "ZeRO-3 gather",
    "offload": "offload (PCIe/NVMe)",
    "cpu": "CPU optimizer",
}
COMM_LANES = ("pp_fwd", "pp_bwd", "dp", "zero", "h2d", "d2h", "nvme", "nvme_w", "cpu")


def _time_unit(step: float) -> tuple[float, str]:
    if step >= 2.0:
        return 1.0, "s"
    if step >= 2e-3:
        return 1e3, "ms"
    return 1e6, "us"


@dataclass(frozen=True)
class Frame:
    """Scale and sizes shared by the lanes of one picture."""

    scale: float  # seconds -> plotted time unit
    px_per_unit: float  # plotted time unit -> pixels
    fontsize: int
    n: int  # lanes (stages)

    @property
    def min_w(self) -> float:
        return 1.0 / self.px_per_unit


def plot_timeline(result: SimResult, path: str | Path, max_stages: int = 32) -> None:
    """Draw the timeline PNG of a DES result to ``path``: a lane per stage (compute stream
    above, communication streams below), the memory of each stage under it."""
    rec = des_record(result)
    devs = [d for d in rec.devices if d.dp == 0 and d.tp == 0][:max_stages]
    n = len(devs)
    scale, unit = _time_unit(rec.step_time)
    T = rec.step_time * scale
    lane_h = 0.55 if n > 8 else 0.8
    fig = Figure(figsize=(16, 1.6 + lane_h * n + 2.6), dpi=110)  # no pyplot: leaves the caller's backend alone
    gs = fig.add_gridspec(2, 1, height_ratios=[lane_h * n + 0.6, 2.4], hspace=0.28)
    ax = fig.add_subplot(gs[0])
    axm = fig.add_subplot(gs[1], sharex=ax)
    frame = Frame(scale, 16 * 110 * 0.78 / max(T, 1e-12), 7 if n > 8 else 8, n)
    used: set[str] = set()
    for row, dev in enumerate(devs):
        used |= _draw_lane(ax, rec, dev, n - 1 - row, frame)
    ax.set_yticks([n - 1 - r + 0.15 for r in range(n)])
    ax.set_yticklabels([f"stage {d.pp}" for d in devs], fontsize=frame.fontsize + 1)
    ax.set_ylim(-0.45, n + 0.05)
    ax.set_xlim(0, T * 1.005)
    ax.grid(axis="x", alpha=0.3)
    plan = result.job.plan
    ax.set_title(
        f"{result.job.model.name} on {result.job.cluster.name}  |  {plan.to_string()}  |  m={result.job.m}\n"
        f"step {rec.step_time:.4g} s, bubble {result.bubble_fraction:.1%} of busy time, "
        f"{result.tflops_per_gpu:.0f} TFLOP/s per GPU, peak memory {result.peak_memory / GiB:.1f} GiB"
        f"  (upper bar: compute stream, lower strip: communication streams)",
        fontsize=10,
    )
    order = [k for k in COLORS if k in used]
    ax.legend(
        handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in order],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.04),
        ncol=min(len(order), 10),
        fontsize=8,
        frameon=False,
    )
    ax.tick_params(axis="x", labelbottom=False)
    _draw_memory(axm, rec, devs, result.memory_capacity / GiB, T, frame)
    axm.set_xlabel(f"time ({unit})")
    fig.savefig(path, bbox_inches="tight")


def _draw_lane(ax: Axes, rec: DesRecord, dev: Device, y: int, frame: Frame) -> set[str]:
    """One stage's compute segments (microbatch numbers on wide passes) and, under them, its
    communication streams; returns the segment and task kinds drawn."""
    eng, scale = rec.engine, frame.scale
    used: set[str] = set()
    bars: dict[str, list[tuple[float, float]]] = {}
    for task in eng.stream_queue[dev.streams["compute"]]:
        t = eng.start[task] * scale
        info = eng.info[task]
        for seg, d in info.segments:
            bars.setdefault(seg, []).append((t, d * scale))
            t += d * scale
        w = eng.dur[task] * scale
        label = str(info.microbatch)
        if eng.kind[task] in ("F", "B", "W") and w * frame.px_per_unit >= 5.5 * len(label) + 3:
            ax.text(
                eng.start[task] * scale + w / 2,
                y + 0.3,
                label,
                ha="center",
                va="center",
                fontsize=frame.fontsize,
                color="white",
                clip_on=True,
            )
    for seg, xs in bars.items():
        ax.broken_barh(xs, (y + 0.05, 0.5), facecolors=COLORS[seg], edgecolor="none")
        used.add(seg)
    comm: dict[str, list[tuple[float, float]]] = {}
    for lane in COMM_LANES:
        s = dev.streams.get(lane)
        for task in eng.stream_queue[s] if s is not None else ():
            if eng.dur[task] > 0:  # at least ~1 pixel wide, so short sends stay visible
                comm.setdefault(eng.kind[task], []).append(
                    (eng.start[task] * scale, max(eng.dur[task] * scale, frame.min_w))
                )
    for kind, xs in comm.items():
        ax.broken_barh(xs, (y - 0.3, 0.28), facecolors=COLORS.get(kind, "#999999"), edgecolor="none", alpha=0.9)
        used.add(kind)
    return used


def _draw_memory(axm: Axes, rec: DesRecord, devs: list[Device], cap: float, T: float, frame: Frame) -> None:
    """Each stage's memory over time against the usable capacity ``cap`` (GiB)."""
    cmap = matplotlib.colormaps["viridis"]
    n = frame.n
    for row, dev in enumerate(devs):
        mem = rec.memory[dev.idx]
        xs = [t * frame.scale for t in mem.times] + [T]
        ys = [v / GiB for v in mem.totals] + [mem.totals[-1] / GiB]
        axm.step(
            xs,
            ys,
            where="post",
            color=cmap(row / max(n - 1, 1)),
            lw=1.1,
            label=f"stage {dev.pp}" if n <= 8 or row in (0, n - 1) else None,
        )
    axm.axhline(cap, color="#C44E52", ls="--", lw=1)
    axm.text(T * 0.995, cap, f"usable {cap:.0f} GiB", ha="right", va="bottom", fontsize=8, color="#C44E52")
    top = max(max(m.peak for m in rec.memory) / GiB, cap)
    axm.set_ylim(0, top * 1.08)
    axm.set_ylabel("memory (GiB)")
    axm.grid(alpha=0.3)
    axm.legend(fontsize=7, ncol=min(n, 8), loc="lower right")
