"""Regenerate everything README.md shows from the current code.

    .venv/bin/python scripts/make_docs.py                 # every section and picture (about 3-4 minutes on 2 cores)
    .venv/bin/python scripts/make_docs.py --only plan-output,gallery-what-if
    .venv/bin/python scripts/make_docs.py --list          # the section names
    .venv/bin/python scripts/make_docs.py --only notebooks  # re-execute notebooks/*.ipynb in place (about 3 minutes)

Every command output in the README sits between a pair of markers,

    <!-- BEGIN: plan-output -->
    ...
    <!-- END: plan-output -->

and this script replaces what lies between them with the real output of the command it runs (``python -m autoplan``
of this checkout, shown as ``autoplan``). Files the README quotes (a model YAML, node and GPU profiles) are copied
in the same way. The gallery pictures go to ``docs/images/*.png``, re-encoded as 256-colour PNGs to stay small.
A marker in README.md without a generator here (or the reverse) is an error, so the two cannot drift apart.

Command outputs are run in a scratch folder (so ``runs/`` and calibration files do not land in the checkout); its
absolute path is shown as ``/path/to/workdir``.

The ``notebooks`` section is not a README section: it executes every ``notebooks/*.ipynb`` top to bottom (nbclient,
``notebooks/`` as the working directory, a ``python3`` kernel of the checkout's ``.venv``) and writes it back with its
outputs, so that the notebooks read on GitHub with their tables and pictures. Volatile metadata (execution
timestamps) is dropped, split stream outputs are joined, inline figures are drawn at NOTEBOOK_DPI and every PNG is
re-encoded as a 256-colour PNG; the kernel's temporary folder is the scratch folder, shown as ``/path/to/workdir``
(and the checkout as ``/path/to/autoplan``).
``tests/test_notebooks.py`` fails when a committed notebook's outputs no longer match what its cells produce (in
structure: output kinds and picture counts per cell), so rerun this section after changing a notebook or what it shows.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
IMAGES = REPO / "docs" / "images"
MAX_PNG_BYTES = 300_000
WORKDIR_LABEL = "/path/to/workdir"

MAIN_JOB = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "128", "--global-batch", "1536"]
PIPELINE_PLAN = "t=8,p=16,mb=1,ckpt=full"
CPU_RUN = ["--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", "t=2,p=2"]

MARKER = re.compile(r"<!-- BEGIN: ([a-z0-9-]+) -->\n(.*?)<!-- END: \1 -->", re.S)


# ------------------------------------------------------------------------------ helpers


class Docs:
    """Shared state: the scratch folder and what earlier sections found (the best plan string)."""

    def __init__(self, work: Path):
        self.work = work
        self.best_plan: str | None = None
        self.last_stderr = ""  # the last command's stderr (emit prints its per-tool summary there)

    def autoplan(self, *args: str, cwd: Path | None = None, timeout: float = 900) -> tuple[str, str]:
        """Run ``python -m autoplan ARGS``; return (the command as shown, stdout). A failure stops the script."""
        cwd = cwd or self.work
        env = {k: v for k, v in os.environ.items() if k != "AUTOPLAN_DEBUG"}
        env["COLUMNS"] = "200"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "autoplan", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        shown = "$ autoplan " + " ".join(args)
        log(f"  {shown}  [exit {proc.returncode}, {time.perf_counter() - t0:.1f} s]")
        if proc.returncode != 0:
            raise SystemExit(f"make_docs: '{shown}' failed with exit code {proc.returncode}:\n{proc.stderr.strip()}")
        self.last_stderr = self.clean(proc.stderr)
        return shown, self.clean(proc.stdout)

    def clean(self, text: str) -> str:
        text = text.replace(str(self.work.resolve()), WORKDIR_LABEL).replace(str(self.work), WORKDIR_LABEL)
        return "\n".join(line.rstrip() for line in text.rstrip().splitlines())

    def clean_keep_lines(self, text: str) -> str:
        """The scratch folder shown as /path/to/workdir, nothing else changed (for notebook outputs)."""
        return text.replace(str(self.work.resolve()), WORKDIR_LABEL).replace(str(self.work), WORKDIR_LABEL)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fence(body: str, lang: str = "text") -> str:
    return f"```{lang}\n{body.rstrip()}\n```\n"


def shrink_png(path: Path) -> int:
    """Re-encode as a 256-colour palette PNG (the pictures are flat-colour charts); return the new size."""
    from PIL import Image

    with Image.open(path) as im:
        q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    q.save(path, optimize=True)
    size = path.stat().st_size
    if size > MAX_PNG_BYTES:
        raise SystemExit(f"make_docs: {path} is {size / 1e3:.0f} KB, over the {MAX_PNG_BYTES / 1e3:.0f} KB limit")
    return size


def _save_figure(plt, fig, name: str) -> None:
    """Lay out ``fig``, write it to docs/images/``name``, close it and shrink the PNG."""
    fig.tight_layout()
    png = IMAGES / name
    fig.savefig(png, bbox_inches="tight")
    plt.close(fig)
    shrink_png(png)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ------------------------------------------------------------------------------ sections


def plan_output(d: Docs) -> str:
    """the main job: autoplan plan for gpt3-175b on 128 dgx-a100-80gb nodes, with --plot docs/images/timeline-best.png"""
    png = IMAGES / "timeline-best.png"
    shown, out = d.autoplan("plan", *MAIN_JOB, "--plot", str(png))
    shrink_png(png)
    m = re.search(r"^plan string: (\S+)", out, re.M)
    if not m:
        raise SystemExit("make_docs: no 'plan string:' line in the plan output")
    d.best_plan = m.group(1)
    return fence(shown.replace(str(png), rel(png)) + "\n" + out)


H100_JOB = ["--model", "gpt3-175b", "--cluster", "dgx-h100", "--nodes", "16", "--global-batch", "256", "--top", "4"]


def modern_plan(d: Docs) -> str:
    """the plan space on H100: autoplan plan for gpt3-175b on 16 dgx-h100 nodes (fp8 and the zero-bubble
    schedule searched), then the same pinned to bf16; headline and top plans of each"""
    runs = [d.autoplan("plan", *H100_JOB, *extra) for extra in ([], ["--fix", "prec=bf16"])]
    return fence("\n\n".join(_plan_summary(shown, out, ("plan ", "step time", "TFLOP/s")) for shown, out in runs))


def _plan_summary(shown: str, out: str, headline: tuple[str, ...]) -> str:
    """A plan command and its output cut to the headline lines starting with ``headline`` and the
    top-plans table."""
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("top plans"))
    end = next((i for i in range(top + 1, len(lines)) if not lines[i].strip()), len(lines))
    head = [line for line in lines[:top] if line.startswith(headline)]
    return "\n".join([shown, *head, "", *lines[top:end]])


LONG_CONTEXT_JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "64", "--global-batch", "64"]
LONG_CONTEXT_JOB += ["--seq-len", "131072", "--top", "3"]


def long_context(d: Docs) -> str:
    """context parallelism: autoplan plan for llama3-70b at 131,072 tokens on 64 dgx-h100 nodes, then
    the same with cp pinned to 1; headline and top plans of each"""
    runs = [d.autoplan("plan", *LONG_CONTEXT_JOB, *extra) for extra in ([], ["--fix", "cp=1"])]
    return fence("\n\n".join(_plan_summary(shown, out, ("plan ", "step time", "peak memory")) for shown, out in runs))


MOE_JOB = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "8", "--global-batch", "256", "--top", "3"]


def moe_plan(d: Docs) -> str:
    """mixture of experts: autoplan plan for mixtral-8x7b on 8 dgx-h100 nodes, then the same with ep pinned
    to 1; headline and top plans of each"""
    runs = [d.autoplan("plan", *MOE_JOB, *extra) for extra in ([], ["--fix", "ep=1"])]
    return fence("\n\n".join(_plan_summary(shown, out, ("plan ", "step time", "TFLOP/s")) for shown, out in runs))


def simulate_output(d: Docs) -> str:
    """autoplan simulate of the t=8,p=16 pipeline plan, with --plot docs/images/timeline-t8p16.png"""
    png = IMAGES / "timeline-t8p16.png"
    shown, out = d.autoplan("simulate", *MAIN_JOB, "--plan", PIPELINE_PLAN, "--plot", str(png))
    shrink_png(png)
    return fence(shown.replace(str(png), rel(png)) + "\n" + out)


def simulate_json(d: Docs) -> str:
    """the same simulate with --json"""
    shown, out = d.autoplan("simulate", *MAIN_JOB, "--plan", PIPELINE_PLAN, "--json")
    return fence(shown + "\n" + out, "json")


def emit_output(d: Docs) -> str:
    """autoplan emit of the main job's best plan"""
    plan = d.best_plan or _best_plan(d)
    shown, out = d.autoplan("emit", *MAIN_JOB, "--plan", plan, "-o", "runs/gpt3-175b")
    return fence(shown + "\n" + d.last_stderr + "\n" + out)


def _best_plan(d: Docs) -> str:
    import json

    _, out = d.autoplan("plan", *MAIN_JOB, "--json")
    d.best_plan = json.loads(out)["best"]["plan_string"]
    return d.best_plan


def _emitted(d: Docs, name: str) -> str:
    path = d.work / "runs" / "gpt3-175b" / name
    if not path.is_file():
        emit_output(d)
    return fence(d.clean(path.read_text()), "bash")


def emit_launch(d: Docs) -> str:
    """the emitted launch.sh"""
    return _emitted(d, "launch.sh")


def emit_slurm(d: Docs) -> str:
    """the emitted slurm.sbatch"""
    return _emitted(d, "slurm.sbatch")


def run_output(d: Docs) -> str:
    """autoplan emit + autoplan run of the tiny model on localhost-cpu (about a minute)"""
    shown_e, out_e = d.autoplan("emit", *CPU_RUN, "-o", "runs/tiny")
    shown_r, out_r = d.autoplan("run", "runs/tiny")
    cores = os.cpu_count()
    return fence(f"{shown_e}\n{out_e}\n{shown_r}\n{out_r}") + (
        f"\n<sub>Generated on a machine with {cores} CPU core{'s' if cores != 1 else ''} "
        f"running the plan's 4 processes.</sub>\n"
    )


def calibrate_output(d: Docs) -> str:
    """autoplan calibrate --device cpu --quick and the start of the profiles it writes"""
    shown, out = d.autoplan("calibrate", "--device", "cpu", "--quick", "-o", "my-cpu.yaml")
    gpu = (d.work / "my-cpu.yaml").read_text().splitlines()
    node = (d.work / "my-cpu-node.yaml").read_text().splitlines()
    table_at = next((i for i, line in enumerate(gpu) if line.strip().startswith("table:")), len(gpu))
    after = next((i for i in range(table_at + 1, len(gpu)) if not gpu[i].startswith("    ")), len(gpu))
    measured_at = next((i for i, line in enumerate(gpu) if line.startswith("measured:")), len(gpu))
    gpu_part = [
        *gpu[: table_at + 4],
        f"    # ... {after - table_at - 4} more lines of the GEMM table",
        *gpu[after:measured_at],
        f"# ... {len(gpu) - measured_at} more lines: a 'measured:' block (raw rates: dispatch, attention)",
    ]
    end = next((i for i, line in enumerate(node) if line.startswith("# Collective times")), len(node))
    node_part = [*node[:end], f"# ... {len(node) - end} more lines: the measured collective times next to the model's"]
    return (
        fence(f"{shown}\n{out}")
        + "\n`my-cpu.yaml` (start):\n\n"
        + fence(d.clean("\n".join(gpu_part)), "yaml")
        + "\n`my-cpu-node.yaml` (start):\n\n"
        + fence(d.clean("\n".join(node_part)), "yaml")
    )


MY_CLUSTER = """\
# my-cluster.yaml: 32 DGX H100 nodes behind a 2:1 oversubscribed fat-tree
name: my-cluster
nodes: 32
node: dgx-h100            # a built-in node name, or a node file such as hwprofiles/nodes/my-gpu-node.yaml
network:
  topology: fat-tree      # fat-tree | rail-optimized | single-switch
  oversubscription: 2.0
"""


def gpu_compare(d: Docs) -> str:
    """benchmarks/gpu_compare.py on the committed H100 runs (no GPU needed)."""
    script = REPO / "benchmarks" / "gpu_compare.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=True)
    return fence("$ python benchmarks/gpu_compare.py\n" + d.clean(proc.stdout))


def cluster_example(d: Docs) -> str:
    """a cluster file and autoplan simulate on it"""
    (d.work / "my-cluster.yaml").write_text(MY_CLUSTER)
    shown, out = d.autoplan(
        "simulate",
        "--model",
        "llama2-70b",
        "--cluster",
        "my-cluster.yaml",
        "--global-batch",
        "512",
        "--plan",
        "t=8,p=4,mb=1,zero=1,ckpt=selective,sp=1",
    )
    return fence(MY_CLUSTER, "yaml") + "\n" + fence(shown + "\n" + out)


HF_CONFIG = """\
{
  "model_type": "mistral",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "num_hidden_layers": 32,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "vocab_size": 32000,
  "max_position_embeddings": 32768,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "tie_word_embeddings": false
}
"""


def hf_config_example(d: Docs) -> str:
    """a Hugging Face config.json and autoplan simulate on it"""
    (d.work / "config.json").write_text(HF_CONFIG)
    shown, out = d.autoplan(
        "simulate",
        "--model",
        "config.json",
        "--seq-len",
        "4096",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "2",
        "--global-batch",
        "256",
        "--plan",
        "t=2,zero=1",
        "--fidelity",
        "analytic",
    )
    head = "\n".join(out.splitlines()[:8])
    return fence(HF_CONFIG, "json") + "\n" + fence(shown + "\n" + head)


def _file(path: str, lang: str = "yaml") -> Callable[[Docs], str]:
    def gen(d: Docs) -> str:
        return fence((REPO / path).read_text(), lang)

    gen.__doc__ = f"the file {path}"
    return gen


# ------------------------------------------------------------------------------ gallery plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


WHAT_IF_NODES = {
    "dgx-a100-80gb": ("DGX A100 80GB (NVSwitch, 8x200 Gb/s IB)", "#4C72B0"),
    "dgx-h100": ("DGX H100 (NVSwitch, 8x400 Gb/s IB)", "#55A868"),
    "pcie-a100-80gb": ("A100 PCIe, no NVLink (2x200 Gb/s IB)", "#C44E52"),
}
WHAT_IF_NUDGE = {"dgx-a100-80gb": (0.92, True), "dgx-h100": (1.0, False), "pcie-a100-80gb": (1.08, False)}
WHAT_IF_GPUS = [16, 32, 64, 128, 256, 512, 1024]
WHAT_IF_MODEL, WHAT_IF_BATCH = "llama2-70b", 1024


def gallery_what_if(d: Docs) -> str:
    """notebooks/02_what_if.ipynb's first figure, condensed: the planner's best plan per cluster size."""
    from autoplan.report import table
    from autoplan.search import NoPlanFits, SearchOptions, search
    from hwprofiles.load import load_cluster
    from simulator.specs import load_model

    plt = _plt()
    model = load_model(WHAT_IF_MODEL)
    opts = SearchOptions(  # bf16 everywhere: the hardware compared at one precision (fp8 runs on H100 only)
        fix="prec=bf16", fidelity="analytic", top=1, max_finalists=1, partition=False, jobs=os.cpu_count() or 1
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
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), dpi=90)
    for node, (label, color) in WHAT_IF_NODES.items():
        pts = [(g, best[node, g]) for g in WHAT_IF_GPUS if best[node, g] is not None]
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
    _save_figure(plt, fig, "what-if-scaling.png")
    rows = []
    for (node, g), r in best.items():
        if g in (16, 128, 1024):
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
    return fence(table(["node", "GPUs", "best plan (analytic)", "tokens/s", "MFU"], rows))


def _identity_axes(ax, lim: tuple[float, float], band: float, xlabel: str, ylabel: str, title: str) -> None:
    """Log-log predicted vs reference: the diagonal, dotted lines at +-band, the legend top left."""
    lo, hi = lim
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (1 + band, 1 - band):
        ax.plot([lo, hi], [f * lo, f * hi], "k:", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=7, loc="upper left")


def _error_axes(ax, xlabel: str, title: str) -> None:
    """Error per point in percent against a log x axis, with the +-10% band."""
    ax.axhspan(-10, 10, color="#55A868", alpha=0.1)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel=xlabel, ylabel="prediction error (%)", title=title)


def gallery_validation(d: Docs) -> str:
    """notebooks/03_validation.ipynb, condensed: Megatron-LM rows and the vTrain runs, error per point."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _accuracy_data as data

    from autoplan.report import table
    from simulator import analytic, simulate
    from simulator.job import NO_DP_OVERLAP

    if not (data.VALIDATION_DIR / "published.yaml").is_file():
        raise SystemExit(
            f"make_docs: the validation data is not at {data.VALIDATION_DIR} (set AUTOPLAN_VALIDATION_DIR)"
        )
    plt = _plt()
    pct = lambda pred, ref: 100.0 * (pred / ref - 1.0)
    mega = []
    for row in data.published_rows():
        job = data.published_as_run(row)  # Megatron-LM's sc21 script: the row's mb, schedule and DDP
        mega.append((row, analytic.estimate(job), simulate(job, "des")))
    groups: dict[str, list[tuple[float, float]]] = {
        "single node, fit subset": [],
        "single node, held out": [],
        "multi-node (64-512 GPUs)": [],
    }
    for name in data.VTRAIN_FILES:
        for r in data.vtrain_rows(name):
            pred = analytic.estimate(dataclasses.replace(r.job, runtime=NO_DP_OVERLAP)).step_time
            g = (
                "multi-node (64-512 GPUs)"
                if "multi" in name
                else ("single node, fit subset" if r.fit_subset else "single node, held out")
            )
            groups[g].append((r.measured_s, pred))

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), dpi=90, gridspec_kw={"width_ratios": [1.1, 1, 1.1]})
    x = range(len(mega))
    labels = [f"{row.params_B:g}B\n{row.gpus} GPUs" for row, _, _ in mega]
    axes[0].bar(
        [i - 0.2 for i in x], [row.tflops_per_gpu for row, _, _ in mega], 0.4, color="#8C8C8C", label="published"
    )
    axes[0].bar(
        [i + 0.2 for i in x], [b.tflops_per_gpu for _, b, _ in mega], 0.4, color="#4C72B0", label="autoplan (analytic)"
    )
    for i, (row, b, _) in enumerate(mega):
        axes[0].text(
            i + 0.2, b.tflops_per_gpu + 3, f"{pct(b.tflops_per_gpu, row.tflops_per_gpu):+.1f}%", ha="center", fontsize=8
        )
    axes[0].set_xticks(list(x), labels, fontsize=8)
    axes[0].set(ylabel="TFLOP/s per GPU", title="Megatron-LM 2021 on Selene: published vs predicted", ylim=(0, 215))
    axes[0].legend(fontsize=8, loc="lower right")
    style = {
        "single node, fit subset": ("#BBBBBB", 5),
        "single node, held out": ("#4C72B0", 7),
        "multi-node (64-512 GPUs)": ("#C44E52", 14),
    }
    lo, hi = 0.05, 100
    for g, pts in groups.items():
        color, size = style[g]
        mape = 100 * sum(abs(p / m - 1) for m, p in pts) / len(pts)
        axes[1].scatter(
            [m for m, _ in pts],
            [p for _, p in pts],
            s=size,
            color=color,
            alpha=0.7,
            label=f"{g}: {len(pts)}, MAPE {mape:.1f}%",
        )
        axes[2].scatter([m for m, _ in pts], [pct(p, m) for m, p in pts], s=size, color=color, alpha=0.7, label=g)
    _identity_axes(
        axes[1],
        (lo, hi),
        0.1,
        "measured iteration time (s)",
        "predicted iteration time (s)",
        "vTrain: 1,549 measured A100 runs (dotted: ±10%)",
    )
    _error_axes(axes[2], "measured iteration time (s)", "vTrain: error per run (band: ±10%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    _save_figure(plt, fig, "validation.png")
    t1 = table(
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
                f"{pct(b.tflops_per_gpu, row.tflops_per_gpu):+.1f}%",
                des.tflops_per_gpu,
                f"{pct(des.tflops_per_gpu, row.tflops_per_gpu):+.1f}%",
            )
            for row, b, des in mega
        ],
    )
    t2 = table(
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
    return fence(t1 + "\n\n" + t2)


def gallery_fsdp(d: Docs) -> str:
    """The published FSDP / ZeRO-3 and Megatron-core rows: measured vs predicted tokens/s per GPU
    per source (picture) and the MAPE per source (table)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _accuracy_fsdp as fsdp

    from autoplan.report import table

    plt = _plt()
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
    _identity_axes(
        axes[0],
        (100, 300_000),
        0.2,
        "published tokens/s per GPU",
        "predicted tokens/s per GPU",
        f"published-fsdp.yaml: {len(pts)} runs (dotted: ±20%)",
    )
    _error_axes(axes[1], "sequence length", "error per run (band: ±10%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    _save_figure(plt, fig, "validation-fsdp.png")
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


# ------------------------------------------------------------------------------ notebooks

NOTEBOOKS = REPO / "notebooks"
NOTEBOOK_DPI = 90  # inline matplotlib figures (the timeline pictures come as PNG files at simulator.des.plot's dpi)
NOTEBOOK_CELL_TIMEOUT_S = 600
MAX_NOTEBOOK_BYTES = 1_500_000
NOTEBOOK_KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
MKDTEMP_SUFFIX = re.compile(r"(/path/to/workdir/tmp/[A-Za-z0-9_.-]*?-)[a-z0-9_]{8}\b")


def _notebook_kernel(d: Docs):
    """An AsyncKernelManager for a ``python3`` kernelspec of the checkout's venv (sys.executable without one), written
    into the scratch folder and looked up only there: no other kernelspec on the machine can be picked up."""
    import json

    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.is_file() else sys.executable
    spec_dir = d.work / "kernels" / "python3"
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": NOTEBOOK_KERNELSPEC["display_name"],
                "language": "python",
                "metadata": {"debugger": False},
            }
        )
    )
    ksm = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ksm), python


def _shrink_png_b64(b64: str) -> str:
    """shrink_png for a notebook's base64 image/png output (kept as it is when it has transparency or grows)."""
    import base64
    import io

    from PIL import Image

    raw = base64.b64decode(b64)
    with Image.open(io.BytesIO(raw)) as im:
        if "A" in im.getbands() and im.getchannel("A").getextrema()[0] < 255:
            return b64
        q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    q.save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode("ascii") if buf.tell() < len(raw) else b64


def _label_paths(text: str, d: Docs) -> str:
    """Machine paths in a notebook's output as labels: the scratch folder (mkdtemp suffixes as XXXXXXXX), the checkout
    and its parent folder."""
    text = MKDTEMP_SUFFIX.sub(r"\1XXXXXXXX", d.clean_keep_lines(text))
    return text.replace(str(REPO), "/path/to/autoplan").replace(str(REPO.parent) + os.sep, "/path/to/")


def _tidy_notebook(nb, d: Docs) -> None:
    """Make an executed notebook stable to commit: fixed kernelspec, no timestamps, joined streams, small PNGs."""
    nb.metadata["kernelspec"] = dict(NOTEBOOK_KERNELSPEC)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("execution", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.outputs:
            if out.output_type == "stream":
                out.text = _label_paths(out.text, d)
                if outputs and outputs[-1].output_type == "stream" and outputs[-1].name == out.name:
                    outputs[-1].text += out.text  # one print split over several messages by the kernel's flushes
                    continue
            data = out.get("data", {})
            if "text/plain" in data:
                data["text/plain"] = _label_paths(data["text/plain"], d)
            if "image/png" in data:
                data["image/png"] = _shrink_png_b64(data["image/png"])
            outputs.append(out)
        cell.outputs = outputs


def notebooks(d: Docs) -> None:
    """execute notebooks/*.ipynb in place and write them back with their outputs (not a README section)"""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not paths:
        raise SystemExit(f"make_docs: no notebooks in {NOTEBOOKS}")
    tmp = d.work / "tmp"  # the notebooks' tempfile.mkdtemp folders land in the scratch folder, removed at the end
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOPLAN_DEBUG", "MPLBACKEND")}
    env["TMPDIR"] = str(tmp)
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        km, python = _notebook_kernel(d)
        client = NotebookClient(
            nb,
            km=km,
            timeout=NOTEBOOK_CELL_TIMEOUT_S,
            record_timing=False,
            allow_errors=False,
            extra_arguments=[f"--InlineBackend.rc={{'figure.dpi': {NOTEBOOK_DPI}}}"],
            resources={"metadata": {"path": str(NOTEBOOKS)}},
        )
        t0 = time.perf_counter()
        try:
            client.execute(env=env)
        except CellExecutionError as e:  # the message holds the failing cell's source and traceback
            raise SystemExit(f"make_docs: {rel(path)} failed (left unchanged):\n{e}") from None
        _tidy_notebook(nb, d)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        if errors:
            raise SystemExit(
                f"make_docs: {rel(path)} has error outputs (left unchanged): {[(o.ename, o.evalue) for o in errors]}"
            )
        nbformat.validate(nb)
        text = nbformat.writes(nb)
        if len(text.encode()) > MAX_NOTEBOOK_BYTES:
            raise SystemExit(
                f"make_docs: {rel(path)} would be {len(text.encode()) / 1e6:.2f} MB, over the "
                f"{MAX_NOTEBOOK_BYTES / 1e6:.1f} MB limit (left unchanged)"
            )
        path.write_text(text if text.endswith("\n") else text + "\n")
        pngs = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        log(
            f"  {rel(path)}: {time.perf_counter() - t0:.1f} s with {python}, {pngs} picture(s), "
            f"{path.stat().st_size / 1e3:.0f} KB"
        )


NOTEBOOK_SECTIONS: dict[str, Callable[[Docs], None]] = {"notebooks": notebooks}


# ------------------------------------------------------------------------------ driver

SECTIONS: dict[str, Callable[[Docs], str]] = {
    "plan-output": plan_output,
    "modern-plan": modern_plan,
    "long-context": long_context,
    "moe-plan": moe_plan,
    "simulate-output": simulate_output,
    "simulate-json": simulate_json,
    "gallery-what-if": gallery_what_if,
    "gallery-validation": gallery_validation,
    "gallery-fsdp": gallery_fsdp,
    "model-yaml": _file("autoplan/models/gpt3-175b.yaml"),
    "hf-config": hf_config_example,
    "gpu-yaml": _file("hwprofiles/gpus/a100-sxm4-80gb.yaml"),
    "node-yaml": _file("hwprofiles/nodes/dgx-a100-80gb.yaml"),
    "cluster-example": cluster_example,
    "emit-output": emit_output,
    "emit-launch": emit_launch,
    "emit-slurm": emit_slurm,
    "run-output": run_output,
    "calibrate-output": calibrate_output,
    "gpu-compare": gpu_compare,
}


def fill(readme: str, bodies: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1)
        body = bodies.get(name, m.group(2))
        return f"<!-- BEGIN: {name} -->\n{body.rstrip()}\n<!-- END: {name} -->"

    return MARKER.sub(sub, readme)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated section names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the sections and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    a = ap.parse_args(argv)
    if a.list:
        for name, fn in {**SECTIONS, **NOTEBOOK_SECTIONS}.items():
            print(f"{name:20} {(fn.__doc__ or '').strip().splitlines()[0] if fn.__doc__ else ''}")
        return 0
    readme = README.read_text()
    in_readme = MARKER.findall(readme)
    names = [n for n, _ in in_readme]
    missing = [n for n in SECTIONS if n not in names]
    unknown = [n for n in names if n not in SECTIONS]
    if missing or unknown or len(set(names)) != len(names):
        raise SystemExit(
            f"make_docs: README markers and generators differ: no marker for {missing}, "
            f"no generator for {unknown}, duplicates {sorted({n for n in names if names.count(n) > 1})}"
        )
    only = [s for s in a.only.split(",") if s]
    bad = [s for s in only if s not in SECTIONS and s not in NOTEBOOK_SECTIONS]
    if bad:
        raise SystemExit(f"make_docs: unknown section(s) {bad} (see --list)")
    IMAGES.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="autoplan-docs-"))
    t0 = time.perf_counter()
    bodies: dict[str, str] = {}
    try:
        d = Docs(work)
        for name, gen in SECTIONS.items():
            if only and name not in only:
                continue
            log(f"[{name}]")
            bodies[name] = gen(d)
        for name, run_notebooks in NOTEBOOK_SECTIONS.items():
            if only and name not in only:
                continue
            log(f"[{name}]")
            run_notebooks(d)
    finally:
        if a.keep:
            log(f"scratch folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if bodies:  # re-read: the sections take minutes, and README.md may have been edited meanwhile
        README.write_text(fill(README.read_text(), bodies))
    sizes = {p.name: p.stat().st_size for p in sorted(IMAGES.glob("*.png"))}
    log(
        f"updated {len(bodies)} README section(s) in {time.perf_counter() - t0:.0f} s; images: "
        + ", ".join(f"{k} {v / 1e3:.0f} KB" for k, v in sizes.items())
        + f" (total {sum(sizes.values()) / 1e3:.0f} KB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
