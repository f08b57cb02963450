"""Data and jobs for benchmarks/accuracy.py: the published Megatron-LM rows, the vTrain
measurements, and the fit of the A100 profile's two fitted numbers.

* ``published.yaml`` (megatron_2021_throughput): GPT models on Selene (DGX A100 80GB nodes,
  hwprofiles/nodes/dgx-a100-80gb.yaml), vocabulary 51200, sequence 2048.
* ``vtrain/ground_truth_single.csv`` (1,440 runs on 2-8 GPUs of one node) and
  ``vtrain/ground_truth_multi.csv`` (109 runs on 64-512 GPUs): Megatron-DeepSpeed iteration
  times on the cluster described by hwprofiles/clusters/vtrain-a100.yaml; GPT with vocabulary
  50257 (padded by the simulator as Megatron does), activation checkpointing on (ckpt=full),
  1F1B, no gradient bucketing (``--framework megatron --no-dp-overlap``), ZeRO off.

The fit split: the rows of ground_truth_single.csv at even 0-based positions in file order
(720 runs) are the fit subset; the odd rows (720) and all of ground_truth_multi.csv and the
Megatron rows are held out.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from _accuracy_cli import RowCommand, models_dir, simulate_command

from hwprofiles.load import load_cluster
from hwprofiles.schema import ClusterSpec, GpuProfile
from simulator.job import Job
from simulator.plan import Plan
from simulator.result import SimResult
from simulator.runtime_spec import Runtime
from simulator.specs import ModelSpec

REPO = Path(__file__).resolve().parents[1]
VALIDATION_DIR = Path(os.environ.get("AUTOPLAN_VALIDATION_DIR", REPO / "validation"))
VTRAIN_FILES = ("ground_truth_single.csv", "ground_truth_multi.csv")
VTRAIN_CLUSTER = "vtrain-a100"  # hwprofiles/clusters/vtrain-a100.yaml
VTRAIN_GPUS_PER_NODE = 8  # its nodes (the 2-4 GPU runs use part of one: --gpus-per-node)
VTRAIN_VOCAB = 50257  # vTrain README / src/config.py: GPT-2 vocabulary
SELENE_NODE = "dgx-a100-80gb"
MEGATRON_VOCAB, MEGATRON_SEQ = 51200, 2048  # published.yaml: vocab 51200, seq 2048


@dataclass(frozen=True)
class VTrainRow:
    """One measured run: its job and the measured iteration time (seconds)."""

    index: int  # 0-based position in the file
    job: Job
    measured_s: float
    label: str

    @property
    def fit_subset(self) -> bool:
        return self.index % 2 == 0


@dataclass(frozen=True)
class PublishedRow:
    params_B: float
    model: ModelSpec
    t: int
    p: int
    gpus: int
    batch: int
    tflops_per_gpu: float


def reference_file(*parts: str) -> Path:
    """A file of the reference data; a missing one stops the benchmark with one line naming it."""
    path = VALIDATION_DIR.joinpath(*parts)
    if not path.is_file():
        raise SystemExit(
            f"accuracy: reference data not found: {path} (the repository ships it in validation/; "
            "AUTOPLAN_VALIDATION_DIR points at another copy)"
        )
    return path


def read_csv(name: str) -> list[dict[str, str]]:
    path = reference_file("vtrain", name)
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0]]
    return [dict(zip(header, (x.strip() for x in r))) for r in rows[1:] if r]


def _cluster_for(base: ClusterSpec, gpus: int) -> ClusterSpec:
    """``gpus`` GPUs of the vTrain cluster: whole nodes, or part of one node for 2-4 GPU runs."""
    per_node = min(base.gpus_per_node, gpus)
    if gpus % per_node:
        raise ValueError(f"{gpus} GPUs do not fill whole {per_node}-GPU nodes")
    node = base.node if per_node == base.gpus_per_node else base.node.model_copy(update={"gpus_per_node": per_node})
    return base.model_copy(update={"node": node, "nodes": gpus // per_node})


def vtrain_command(r: dict[str, str]) -> RowCommand:
    """One vTrain run as the ``autoplan simulate`` command that predicts it: Megatron-LM's model
    code under Megatron-DeepSpeed with gradient bucketing off (``--framework megatron
    --no-dp-overlap``), whole nodes of the vTrain cluster or part of one (--gpus-per-node)."""
    gpus = int(r["# GPUs"])
    t, d, p = int(r["tensor parallelism"]), int(r["data parallelism"]), int(r["pipeline parallelism"])
    model = ModelSpec(
        name=f"gpt-h{r['hidden size']}-l{r['# layers']}-s{r['sequence length']}",
        num_layers=int(r["# layers"]),
        hidden_size=int(r["hidden size"]),
        num_attention_heads=int(r["attention heads"]),
        vocab_size=VTRAIN_VOCAB,
        seq_length=int(r["sequence length"]),
        attention="materialized",  # Megatron-DeepSpeed's fused softmax, no flash attention
    )
    per_node = min(VTRAIN_GPUS_PER_NODE, gpus)
    plan = Plan(t=t, p=p, d=d, mb=int(r["micro batch"]), zero=0, ckpt="full", schedule="1f1b")
    extra = ["--no-dp-overlap"] + (["--gpus-per-node", str(per_node)] if per_node < VTRAIN_GPUS_PER_NODE else [])
    return simulate_command(
        model, models_dir(), VTRAIN_CLUSTER, gpus // per_node, int(r["global batch"]), plan, "megatron", extra
    )


def vtrain_rows(name: str, base: ClusterSpec | None = None) -> list[VTrainRow]:
    """The runs of one vTrain file as ``autoplan simulate`` builds them (:func:`vtrain_command`);
    with ``base``, on that cluster instead (the fit's and the comparison's variants)."""
    out = []
    for i, r in enumerate(read_csv(name)):
        job = vtrain_command(r).job()
        if base is not None:
            job = Job(job.model, _cluster_for(base, job.plan.gpus), job.plan, job.global_batch, job.runtime)
        size = f"{r['Parameters (billion)']}B " if "Parameters (billion)" in r else ""
        p = job.plan
        label = f"{size}h={job.model.hidden_size} l={job.model.num_layers} B={job.global_batch} t={p.t} d={p.d} p={p.p} mb={p.mb}"
        out.append(VTrainRow(i, job, float(r["iteration time (ms)"]) / 1e3, label))
    return out


def published_rows() -> list[PublishedRow]:
    data = yaml.safe_load(reference_file("published.yaml").read_text())
    out = []
    for r in data["megatron_2021_throughput"]:
        model = ModelSpec(
            name=f"gpt-{r['params_B']}B",
            num_layers=r["layers"],
            hidden_size=r["hidden"],
            num_attention_heads=r["heads"],
            vocab_size=MEGATRON_VOCAB,
            seq_length=MEGATRON_SEQ,
            attention="materialized",  # Megatron-LM 2021: fused scale-mask-softmax, no flash attention
        )
        out.append(PublishedRow(r["params_B"], model, r["t"], r["p"], r["gpus"], r["batch"], r["tflops_per_gpu"]))
    return out


@dataclass(frozen=True)
class Sc21Run:
    """How Megatron-LM's own script for the paper's Table 1 ran a row
    (examples/academic_paper_scripts/sc21/run_table_1.sh in NVIDIA/Megatron-LM): the microbatch
    size (``MBS``), the layers per virtual pipeline stage (``--num-layers-per-virtual-pipeline-stage``;
    None: plain 1F1B) and the data-parallel implementation (``--DDP-impl``: "torch" is PyTorch
    DDP, whose bucketed all-reduce overlaps the backward pass; "local" is Megatron-LM's own,
    one all-reduce after the last backward). CONFIG.sh adds what every row shares: fp16, sequence
    2048, ``--activations-checkpoint-method uniform`` (every layer fully recomputed)."""

    mb: int
    layers_per_virtual_stage: int | None
    ddp: str


#: run_table_1.sh's settings for the published rows, by (layers, hidden size)
SC21_RUNS = {
    (24, 2304): Sc21Run(16, None, "torch"),  # 1.7B
    (36, 4096): Sc21Run(16, None, "torch"),  # 7.5B
    (48, 8192): Sc21Run(4, None, "local"),  # 39B
    (80, 12288): Sc21Run(2, 5, "local"),  # 145B
    (128, 25600): Sc21Run(1, None, "local"),  # 1T
}


def published_command(row: PublishedRow) -> RowCommand:
    """A published row as Megatron-LM's script ran it (:class:`Sc21Run`), as the ``autoplan
    simulate --framework megatron`` command that predicts it: its t and p, zero=0, ckpt=full,
    sp=0 (sequence parallelism came a year later), the script's microbatch size, schedule and
    data-parallel implementation (``--no-dp-overlap`` for Megatron-LM's "local" DDP)."""
    run = SC21_RUNS.get((row.model.num_layers, row.model.hidden_size))
    if run is None:
        raise SystemExit(f"accuracy: no Megatron-LM sc21 script settings for the {row.params_B}B row")
    d = row.gpus // (row.t * row.p)
    lpvs = run.layers_per_virtual_stage
    plan = Plan(
        t=row.t,
        p=row.p,
        d=d,
        mb=run.mb,
        zero=0,
        ckpt="full",
        schedule="interleaved" if lpvs else "1f1b",
        v=row.model.num_layers // (row.p * lpvs) if lpvs else 1,
    )
    extra = [] if run.ddp == "torch" else ["--no-dp-overlap"]
    return simulate_command(row.model, models_dir(), SELENE_NODE, row.gpus // 8, row.batch, plan, "megatron", extra)


def published_as_run(row: PublishedRow) -> Job:
    """:func:`published_command`'s job."""
    return published_command(row).job()


def selene(gpus: int) -> ClusterSpec:
    return load_cluster(SELENE_NODE, nodes=gpus // 8)


def planner_megatron_best(
    row: PublishedRow, runtime: Runtime, fidelity: str = "analytic", sp: bool = False
) -> SimResult:
    """The planner's best plan for a Megatron-LM row: its t and p, zero=0, ckpt=full (sp=0 unless
    ``sp``), the microbatch size free, among the schedules Megatron-LM runs (its profile's,
    autoplan/frameworks/profiles/megatron.yaml: the planner's GPipe and zero-bubble plans are not
    what its rows measured)."""
    from autoplan.frameworks import load_framework
    from autoplan.search import SearchOptions, search
    from hwprofiles.errors import AutoplanError

    found = []
    for schedule in load_framework("megatron").runs.schedules if row.p > 1 else ("1f1b",):
        fix = f"t={row.t},p={row.p},zero=0,ckpt=full,schedule={schedule}" + ("" if sp else ",sp=0")
        opts = SearchOptions(fix=fix, fidelity=fidelity, top=4, runtime=runtime)
        try:
            found.append(search(row.model, selene(row.gpus), row.batch, opts).best_result)
        except AutoplanError:  # no valid or fitting plan with that schedule
            continue
    if not found:
        raise SystemExit(f"no plan of {row.params_B}B on {row.gpus} GPUs fits with Megatron-LM's schedules")
    return min(found, key=lambda r: r.step_time)


def megatron_1f1b_best(row: PublishedRow, max_mb: int = 16) -> tuple[Job, SimResult] | None:
    """The row as Megatron-LM 2021 ran it: its t and p, zero=0, ckpt=full, sp=0, 1F1B and no
    data-parallel overlap (local DDP); of the microbatch sizes <= max_mb that fit, the one with
    the highest analytic tflops_per_gpu. None when none fits. (benchmarks/accuracy.py lets the
    planner choose the schedule too.)"""
    from simulator.analytic import estimate
    from simulator.plan import validate_plan
    from simulator.runtime_spec import NO_DP_OVERLAP

    cluster = selene(row.gpus)
    d = row.gpus // (row.t * row.p)
    best = None
    for mb in range(1, min(max_mb, row.batch // d) + 1):
        if (row.batch // d) % mb:
            continue
        plan = Plan(t=row.t, p=row.p, d=d, mb=mb, zero=0, ckpt="full", schedule="1f1b")
        validate_plan(row.model, plan, cluster.num_gpus, row.batch)
        job = Job(row.model, cluster, plan, row.batch, NO_DP_OVERLAP)
        r = estimate(job)
        if r.fits and (best is None or r.tflops_per_gpu > best[1].tflops_per_gpu):
            best = (job, r)
    return best


# ----------------------------------------------------------------------------------- fit


def with_gpu(rows: Iterable[VTrainRow], gpu: GpuProfile) -> list[VTrainRow]:
    """The same runs, each with the runtime it is predicted with, on clusters whose nodes carry
    ``gpu`` (one copy per distinct cluster)."""
    swapped: dict[int, ClusterSpec] = {}
    out = []
    for r in rows:
        c = r.job.cluster
        if id(c) not in swapped:
            swapped[id(c)] = c.model_copy(update={"node": c.node.model_copy(update={"gpu": gpu})})
        out.append(VTrainRow(r.index, replace(r.job, cluster=swapped[id(c)]), r.measured_s, r.label))
    return out


def mape(errors: Iterable[float]) -> float:
    errs = list(errors)
    return 100.0 * sum(abs(e) for e in errs) / len(errs) if errs else float("nan")


def fit_a100(
    rows: list[VTrainRow], predict: Callable[[Job], float], gpu: GpuProfile, log: Callable[[str], None] = print
) -> tuple[float, float, float]:
    """Fit (kernel_launch_us, gemm.max_efficiency) of ``gpu`` to ``rows`` by minimizing the mean
    absolute percentage error of ``predict`` (Nelder-Mead from the profile's datasheet values,
    4 us and 0.82). Returns (kernel_launch_us, max_efficiency, MAPE on rows)."""
    import numpy as np
    from scipy.optimize import minimize

    def profile(x: np.ndarray) -> GpuProfile:
        gemm = gpu.gemm.model_copy(update={"max_efficiency": float(min(max(x[1], 0.05), 1.0))})
        return gpu.model_copy(update={"kernel_launch_us": float(max(x[0], 0.0)), "gemm": gemm})

    calls = [0]

    def objective(x: np.ndarray) -> float:
        calls[0] += 1
        g = profile(x)
        return mape(predict(r.job) / r.measured_s - 1 for r in with_gpu(rows, g))

    best = None
    for start in ((4.0, 0.82), (40.0, 0.75)):
        res = minimize(
            objective, np.array(start), method="Nelder-Mead", options={"xatol": 0.05, "fatol": 1e-3, "maxfev": 200}
        )
        log(
            f"  from {start}: kernel_launch_us={res.x[0]:.2f} max_efficiency={res.x[1]:.4f} MAPE={res.fun:.3f}% "
            f"({calls[0]} evaluations so far)"
        )
        if best is None or res.fun < best.fun:
            best = res
    return float(best.x[0]), float(best.x[1]), float(best.fun)
