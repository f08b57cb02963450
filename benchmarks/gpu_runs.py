"""Measured vs predicted on one GPU: ``autoplan emit`` + ``autoplan run`` of single-GPU plans.

Issue 17's comparison: t = p = d = 1 plans of a ~1B model (Llama 3.2 1B, seq 2048) and a
7B-layer slice (eight Llama 2 7B layers, seq 4096), each at three microbatch sizes and the
recomputation modes, a ZeRO-3 CPU-offload plan (FSDP2's CPUOffloadPolicy, the one offload
the torch program runs), and one loss-equivalence check (fp32 SGD on the GPU against the
single-process CPU reference) on a small model. Each case is emitted for one GPU of
``--cluster`` (default dgx-h100) and run with ``autoplan run``'s own launcher; one JSON line
per case goes to ``--out`` (the plan, the prediction stored at emit time, and the measured
step times, peak allocated and peak reserved memory).

Run on a CUDA machine (the measurements committed under ``benchmarks/data/`` were made so)::

    python benchmarks/gpu_runs.py --out benchmarks/data/h100-runs.jsonl

``--cases 1b`` (or ``7b``, ``offload``, ``check``) runs a subset; ``--list`` prints the cases.
``benchmarks/gpu_compare.py`` re-predicts the committed runs with the current model and prints
the errors, on any machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"


@dataclass(frozen=True)
class Case:
    group: str
    model: str  # a built-in name or a YAML path
    global_batch: int
    plan: str
    check_steps: int = 0  # >0: also run the fp32 SGD loss-equivalence check

    @property
    def name(self) -> str:
        return f"{Path(self.model).stem}/B={self.global_batch}/{self.plan}"


def cases() -> list[Case]:
    one_b, seven_b = str(MODELS / "llama3.2-1b.yaml"), str(MODELS / "llama2-7b-8layers.yaml")
    out = [
        Case("1b", one_b, 8, f"t=1,p=1,d=1,mb={mb},ckpt={ckpt}")
        for ckpt in ("none", "selective", "full")
        for mb in (1, 2, 4)
    ]
    out += [
        Case("7b", seven_b, 4, f"t=1,p=1,d=1,mb={mb},ckpt={ckpt}")
        for ckpt in ("none", "selective", "full")
        for mb in (1, 2, 4)
    ]
    out += [Case("offload", one_b, 8, "t=1,p=1,d=1,mb=2,ckpt=none,zero=3,offload=cpu")]
    out += [Case("check", "tiny", 8, "t=1,p=1,d=1,mb=2,ckpt=none", check_steps=3)]
    return out + independent_cases() + host_cases()


def independent_cases() -> list[Case]:
    """The runs of the independent H100 measurement of 2026-11-26 (shared/gpu/h100-2026-11-26,
    runs.json), models and plans chosen apart from the cases above: group ``shared``, and
    ``shared-offload`` for its ZeRO-3 CPU-offload run."""
    gpt, l7, l8 = (str(MODELS / f"{m}.yaml") for m in ("gpt-1.3b", "llama7b-slice", "llama3-8b-slice"))
    out = [Case("shared", gpt, 16, f"t=1,p=1,d=1,mb={mb},zero=0,ckpt=none") for mb in (4, 2, 1)]
    out += [
        Case("shared", gpt, 16, "t=1,p=1,d=1,mb=4,zero=0,ckpt=full"),
        Case("shared", gpt, 32, "t=1,p=1,d=1,mb=8,zero=0,ckpt=selective"),
        Case("shared", l7, 8, "t=1,p=1,d=1,mb=1,zero=0,ckpt=none"),
        Case("shared", l8, 4, "t=1,p=1,d=1,mb=1,zero=0,ckpt=none"),
        Case("shared-offload", l7, 8, "t=1,p=1,d=1,mb=1,zero=3,ckpt=none,offload=cpu"),
    ]
    return out


def host_cases() -> list[Case]:
    """Small microbatches, where the eager program's host work bounds the step (group ``host``):
    the 1.3B model at mb=1 with full recomputation (the forward's host work twice per
    microbatch) and at mb=2 with selective recomputation, and the 7B-layer slice at mb=2."""
    gpt, l7 = (str(MODELS / f"{m}.yaml") for m in ("gpt-1.3b", "llama7b-slice"))
    return [
        Case("host", gpt, 16, "t=1,p=1,d=1,mb=1,zero=0,ckpt=full"),
        Case("host", gpt, 16, "t=1,p=1,d=1,mb=2,zero=0,ckpt=selective"),
        Case("host", l7, 8, "t=1,p=1,d=1,mb=2,zero=0,ckpt=none"),
    ]


def run_case(case: Case, cluster: str, steps: int, timeout_s: float) -> dict[str, object]:
    from autoplan.verify import run_and_verify

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        emit = [sys.executable, "-m", "autoplan", "-q", "emit", "--model", case.model, "--cluster", cluster]
        emit += ["--nodes", "1", "--gpus-per-node", "1", "--global-batch", str(case.global_batch)]
        emit += ["--plan", case.plan, "--target", "torch", "-o", str(run_dir)]
        done = subprocess.run(emit, capture_output=True, text=True)
        if done.returncode not in (0, 3):  # 3: predicted not to fit; run, it measures the prediction too
            return {"case": case.name, "error": f"emit exited {done.returncode}: {done.stderr.strip()[-400:]}"}
        start = time.perf_counter()
        try:
            result = run_and_verify(run_dir, steps, timeout_s, log=lambda msg: None, check_steps=case.check_steps)
        except Exception as e:  # a failed case is recorded, the others still run
            return {"case": case.name, "error": f"{type(e).__name__}: {e}"}
        result["wall_s"] = time.perf_counter() - start
    return {"case": case.name, "group": case.group, "model": Path(case.model).stem, **result}


def _done(path: Path) -> set[str]:
    """Cases ``path`` already holds a result (not an error) for."""
    if not path.is_file():
        return set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["case"] for r in rows if "error" not in r}


def _f(x: object) -> str:
    return f"{x:.4f}" if isinstance(x, float) else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON-lines file to append the results to")
    ap.add_argument("--cases", default="1b,7b,offload,check", help="comma-separated groups (default: all)")
    ap.add_argument("--cluster", default="dgx-h100", help="cluster or node the plans are emitted for")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run (after the warm-up)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--resume", action="store_true", help="skip the cases --out already holds without an error")
    ap.add_argument("--match", default="", help="only the cases whose name contains this text")
    a = ap.parse_args(argv)
    groups = set(a.cases.split(","))
    done = _done(a.out) if a.resume else set()
    todo = [c for c in cases() if c.group in groups and c.name not in done and a.match in c.name]
    if a.list:
        print("\n".join(c.name for c in todo))
        return 0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for case in todo:
        row = run_case(case, a.cluster, a.steps, a.timeout)
        with a.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if "error" in row:
            print(f"{case.name:60} ERROR {row['error']}", flush=True)
        else:
            print(
                f"{case.name:60} time {_f(row['measured_step_time_s'])} s (pred {_f(row['predicted_step_time_s'])}) "
                f"mem {_f(row['measured_peak_memory_gib'])} GiB (pred {_f(row['predicted_peak_memory_gib'])}, "
                f"reserved {_f(row['measured_peak_reserved_gib'])}) loss_match {row.get('loss_match')}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
