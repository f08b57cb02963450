"""Single-GPU runs measured on an H100 or H200 vs what the current model predicts for them.

Reads the runs ``benchmarks/gpu_runs.py`` recorded (``autoplan run`` of t = p = d = 1 plans),
re-predicts each with the analytic model as ``autoplan emit`` does (the torch program's job, one
GPU of the set's node), and prints per run the measured and predicted step time and peak memory
(``torch.cuda.max_memory_allocated``) with the signed errors, then the MAPE and the range.
Runs on any machine (no GPU needed)::

    python benchmarks/gpu_compare.py
    python benchmarks/gpu_compare.py --runs FILE [FILE ...] --cluster hgx-h200 --gpu built-in PROFILE.yaml

By default it reads two sets, each with its node's built-in GPU profile and with the profile
its session's ``autoplan calibrate --device cuda`` wrote: the H100 runs of benchmarks/data/ (the
first session's; the session of benchmarks/gpu_session.sh, 2026-11-26: the independent set
again and small microbatches; the independent measurement's ``../shared/gpu/h100-2026-11-26/
runs.json``, where present) on dgx-h100; the second H100 session's (benchmarks/data/
h100-2026-11-27: the independent set's runs and its offload run, at a later commit) on dgx-h100;
and the H200 session's (benchmarks/data/h200-2026-11-27: the same) on hgx-h200.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
sys.path.insert(0, str(HERE.parent))

from gpu_runs import MODELS  # noqa: E402  (benchmarks/gpu_runs.py: where the cases' models live)

from autoplan.runtime.support import program_job  # noqa: E402
from hwprofiles.load import load_cluster, load_gpu  # noqa: E402
from simulator import simulate  # noqa: E402
from simulator.job import Job  # noqa: E402
from simulator.model_files import load_model  # noqa: E402
from simulator.plan import parse_plan  # noqa: E402


def model_file(name: str) -> Path | None:
    """The benchmark model a run used (benchmarks/models/, as gpu_runs.py emits them), or None
    for a built-in model."""
    path = MODELS / f"{name}.yaml"
    return path if path.is_file() else None


BUILT_IN = "built-in"  # --gpu's name for the node's own GPU profile
#: the independent H100 measurement of 2026-11-26 (its runs.json; the models are in benchmarks/models)
SHARED_RUNS = HERE.parent.parent / "shared" / "gpu" / "h100-2026-11-26" / "runs.json"
H100_SESSION, H200_SESSION = DATA / "h100-2026-11-26b", DATA / "h200-2026-11-27"
H100_SECOND_SESSION = DATA / "h100-2026-11-27"


@dataclass(frozen=True)
class RunSet:
    """Run files measured on one kind of GPU, the node they were emitted for, and the profile
    ``autoplan calibrate --device cuda`` wrote on that GPU."""

    runs: list[Path]
    cluster: str
    calibrated: Path


def default_sets() -> list[RunSet]:
    """The committed sessions (module docstring). The H100 calibration is the session's with the
    per-layer eager slopes its probe measured (what calibrate measures since; the session's own
    file has the one-layer figures it wrote before)."""
    h100 = [DATA / "h100-runs.jsonl", DATA / "h100-runs-fused.jsonl", H100_SESSION / "runs.jsonl"]
    h100 += [SHARED_RUNS] * SHARED_RUNS.is_file()
    return [
        RunSet(h100, "dgx-h100", H100_SESSION / "h100-calibrated-slopes.yaml"),
        RunSet([H100_SECOND_SESSION / "runs.jsonl"], "dgx-h100", H100_SECOND_SESSION / "h100-calibrated.yaml"),
        RunSet(
            [H200_SESSION / "runs.jsonl", H200_SESSION / "runs2.jsonl"],
            "hgx-h200",
            H200_SESSION / "h200-calibrated.yaml",
        ),
    ]


def read_runs(path: Path) -> list[dict]:
    """The runs of ``path`` as benchmarks/gpu_runs.py records them: its JSON lines, or the shared
    measurement's runs.json (name, model file, plan, global batch), converted."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for r in json.loads(path.read_text()):
        model = Path(r["model"]).stem
        rows.append({**r, "model": model, "case": f"{model}/B={r['global_batch']}/{r['plan']}"})
    return rows


def predict(row: dict, cluster_ref: str, gpu_ref: str | None) -> tuple[float, float]:
    """(step time s, peak memory GiB) the analytic model predicts for one recorded run."""
    model = load_model(str(model_file(row["model"]) or row["model"]))
    cluster = load_cluster(cluster_ref, 1, 1)
    if gpu_ref is not None:
        cluster = cluster.model_copy(update={"node": cluster.node.model_copy(update={"gpu": load_gpu(gpu_ref)})})
    _, batch, plan_text = row["case"].split("/", 2)
    global_batch = int(batch.removeprefix("B="))
    plan, _ = parse_plan(plan_text, model, 1, global_batch)
    result = simulate(program_job(Job.make(model, cluster, plan, global_batch)), "analytic").to_dict()
    return result["step_time_s"], result["peak_memory_gib"]


def _err(measured: float, predicted: float) -> float:
    return 100.0 * (predicted - measured) / measured


def _summary(name: str, errors: list[float]) -> str:
    if not errors:
        return f"{name}: no runs"
    mape = sum(abs(e) for e in errors) / len(errors)
    return f"{name}: MAPE {mape:.1f}%, errors {min(errors):+.1f}% .. {max(errors):+.1f}% over {len(errors)} runs"


def _compare(path: Path, cluster: str, gpu: str | None) -> None:
    """The table and summary of one file of runs."""
    rows = read_runs(path)
    print(f"{path.parent.name}/{path.name}, GPU profile: {Path(gpu).name if gpu else 'the built-in one of ' + cluster}")
    print(f"{'run':62}{'time s':>9}{'pred':>8}{'err':>8}{'mem GiB':>9}{'pred':>7}{'err':>8}")
    t_err: list[float] = []
    m_err: list[float] = []
    for row in rows:
        if "error" in row or "measured_step_time_s" not in row:
            print(f"{row['case']:62} failed: {row.get('error', 'no step time recorded')[:60]}")
            continue
        t_pred, m_pred = predict(row, cluster, gpu)
        t, m = row["measured_step_time_s"], row["measured_peak_memory_gib"]
        te, me = _err(t, t_pred), _err(m, m_pred)
        if model_file(row["model"]) and "offload" not in row["case"]:
            t_err.append(te)
            m_err.append(me)
        print(f"{row['case']:62}{t:9.4f}{t_pred:8.4f}{te:+7.1f}%{m:9.2f}{m_pred:7.2f}{me:+7.1f}%")
    print(_summary("step time (1B and 7B-slice runs, no offload)", t_err))
    print(_summary("peak memory (same runs)", m_err))
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, nargs="+", help="run files (default: the committed sessions, docstring)")
    ap.add_argument("--cluster", default="dgx-h100", help="node --runs were emitted for (default dgx-h100)")
    ap.add_argument(
        "--gpu",
        nargs="+",
        help="GPU profiles to predict --runs with (names or YAML paths; 'built-in': the node's own); default: built-in",
    )
    a = ap.parse_args(argv)
    if a.runs:
        sets = [(a.runs, a.cluster, [None if ref == BUILT_IN else ref for ref in a.gpu or [BUILT_IN]])]
    else:
        if a.gpu:
            ap.error("--gpu needs --runs (the default sets use their own sessions' calibrations)")
        sets = [(s.runs, s.cluster, [None, str(s.calibrated)]) for s in default_sets()]
    for runs, cluster, profiles in sets:
        for path in runs:
            for gpu in profiles:
                _compare(path, cluster, gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
