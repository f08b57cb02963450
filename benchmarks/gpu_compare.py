"""Single-GPU runs measured on an H100 vs what the current model predicts for them.

Reads the runs ``benchmarks/gpu_runs.py`` recorded (default: ``benchmarks/data/h100-runs.jsonl``,
``autoplan run`` of t = p = d = 1 plans on one H100 80GB HBM3, 2026-11-25, when the program
stepped torch's default foreach AdamW; and ``h100-runs-fused.jsonl``, the ckpt=full 7B-slice runs
again once it steps fused AdamW on a GPU, autoplan/runtime/trainer.py), re-predicts each
with the analytic model as ``autoplan emit`` does (the torch program's job, one GPU of
``--cluster``), and prints per run the measured and predicted step time and peak memory
(``torch.cuda.max_memory_allocated``) with the signed errors, then the MAPE and the range.
``--gpu`` swaps the node's GPU profile (a name or a YAML path), e.g. to compare the
datasheet profile with a calibrated one. Runs on any machine (no GPU needed)::

    python benchmarks/gpu_compare.py
    python benchmarks/gpu_compare.py --gpu benchmarks/data/h100-calibrate.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
sys.path.insert(0, str(HERE.parent))

from gpu_runs import MODELS  # noqa: E402  (benchmarks/gpu_runs.py: where the cases' models live)

from autoplan.runtime.support import program_job  # noqa: E402
from hwprofiles.load import load_cluster, load_gpu  # noqa: E402
from simulator import simulate  # noqa: E402
from simulator.job import Job  # noqa: E402
from simulator.plan import parse_plan  # noqa: E402
from simulator.specs import load_model  # noqa: E402


def model_file(name: str) -> Path | None:
    """The benchmark model a run used (benchmarks/models/, as gpu_runs.py emits them), or None
    for a built-in model."""
    path = MODELS / f"{name}.yaml"
    return path if path.is_file() else None


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
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(f"{path.name}")
    print(f"{'run':62}{'time s':>9}{'pred':>8}{'err':>8}{'mem GiB':>9}{'pred':>7}{'err':>8}")
    t_err: list[float] = []
    m_err: list[float] = []
    for row in rows:
        if "error" in row:
            print(f"{row['case']:62} failed: {row['error'][:60]}")
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
    ap.add_argument("--runs", type=Path, nargs="+", default=[DATA / "h100-runs.jsonl", DATA / "h100-runs-fused.jsonl"])
    ap.add_argument("--cluster", default="dgx-h100", help="node the runs were emitted for (default dgx-h100)")
    ap.add_argument("--gpu", help="GPU profile to use instead of the node's (name or YAML path)")
    a = ap.parse_args(argv)
    for path in a.runs:
        _compare(path, a.cluster, a.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
