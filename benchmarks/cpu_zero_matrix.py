"""CPU runs of the tiny model over t, p, d in {1, 2, 4} (t*p*d <= 4 ranks) and ZeRO 0-3 on the
localhost-cpu node: ``autoplan emit`` + ``autoplan run`` of each plan, measured beside predicted.

    python benchmarks/cpu_zero_matrix.py [--node NODE.yaml] [--repeats N] [--only TEXT] [--steps N]

``--node`` predicts with a node profile of this machine (``autoplan calibrate --device cpu
--ranks 4 -o CPU.yaml --node-out NODE.yaml``, as a user checks a plan on their own host), and
``autoplan run``'s host speed check measures against it (``AUTOPLAN_CPU_NODE``); the
default is the built-in localhost-cpu (a 2-core Intel Xeon VM, 2026-11-29; before it another, 2026-11-27,
and an AMD EPYC VM, 2026-11-21).

Each run also reports the host's speed right after it against the profile's (``autoplan run``'s
host speed check, hwprofiles/calibrate/speed.py) and the prediction at that speed: on a shared VM
the speed drifts by tens of percent within an hour, which the profile's prediction cannot know.

Targets (issue 36): step time within 20% each; peak memory within 30% or 32 MiB, whichever is
larger (on CPU the measured memory is ``autoplan run``'s: the busiest rank's anonymous memory at its
resident peak, grown since before the model was built, so the runtime's own buffers count at this size). Plans with d = 1 run ZeRO 0
only (a ZeRO stage shards over d: with d = 1 the program is the same). A plan ``autoplan emit``
refuses (autoplan.runtime.support.unsupported_reason) is listed as such. Every prediction is
made before the first run starts (the table compares the code as it was at start-up), and each
row reports the host's 1-minute load average before its run: the host has 2 cores, and another
process's load moves a step time by tens of percent. Not run in CI (about 30 s per plan).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoplan.emit.writer import write_run_dir
from autoplan.runtime.support import program_job, unsupported_reason
from autoplan.verify import run_and_verify
from hwprofiles.load import load_cluster
from simulator import simulate
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import num_microbatches, parse_plan

MODEL, NODE, BATCH, MB = "tiny", "localhost-cpu", 8, 2
TIME_TARGET_PCT, MEMORY_TARGET_PCT, MEMORY_TARGET_MIB = 20.0, 30.0, 32.0
TIMED_S, MIN_STEPS, MAX_STEPS = 3.0, 5, 40  # timed steps: about TIMED_S seconds at the predicted step time
MiB = 2**20


@contextlib.contextmanager
def environment(setting: dict[str, str]) -> Iterator[None]:
    """``setting`` added to this process's environment, which ``autoplan run``'s workers inherit,
    and the previous values restored after."""
    saved = {k: os.environ.get(k) for k in setting}
    os.environ.update(setting)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def layouts() -> list[tuple[int, int, int]]:
    """(t, p, d) with each in {1, 2, 4} and t*p*d <= 4."""
    return [x for x in itertools.product((1, 2, 4), repeat=3) if math.prod(x) <= 4]


def plan_texts() -> list[str]:
    """The matrix's plans: every layout with ZeRO 0-3 where d > 1, ZeRO 0 where d = 1."""
    return [f"t={t},p={p},d={d},mb={MB},zero={z}" for t, p, d in layouts() for z in (range(4) if d > 1 else (0,))]


@dataclass
class Row:
    text: str
    predicted_s: float | None = None
    predicted_mib: float | None = None
    measured_s: float | None = None
    measured_mib: float | None = None
    load: float | None = None
    speed: float | None = None  # the host's speed after the run over its profile's
    at_speed_s: float | None = None  # the prediction at that speed
    note: str = ""
    job: Job | None = None

    def time_error(self, at_speed: bool = False) -> float | None:
        predicted = self.at_speed_s if at_speed else self.predicted_s
        if self.measured_s is None or not predicted:
            return None
        return 100.0 * (self.measured_s / predicted - 1)

    def memory_error(self) -> float | None:
        if self.measured_mib is None or not self.predicted_mib:
            return None
        return 100.0 * (self.measured_mib / self.predicted_mib - 1)

    def ok(self, at_speed: bool = False) -> bool | None:
        """Within both targets (module docstring), with the profile's prediction or the one at the
        host's speed; None when not measured."""
        te, me = self.time_error(at_speed), self.memory_error()
        if te is None or me is None or self.measured_mib is None or self.predicted_mib is None:
            return None
        memory_ok = abs(self.measured_mib - self.predicted_mib) <= max(
            MEMORY_TARGET_PCT / 100 * self.predicted_mib, MEMORY_TARGET_MIB
        )
        return abs(te) <= TIME_TARGET_PCT and memory_ok


def predict(text: str, node: str = NODE) -> Row:
    """The plan's prediction as ``autoplan run`` makes it (autoplan.verify.cpu_job: the node with
    as many ranks as the plan, autoplan's program), or why it is not run."""
    row = Row(text)
    model = load_model(MODEL)
    ranks = math.prod(int(kv.split("=")[1]) for kv in text.split(",") if kv[0] in "tpd")
    cluster = load_cluster(node, gpus_per_node=ranks)
    plan, _ = parse_plan(text, model, ranks, BATCH)
    reason = unsupported_reason(model, plan, num_microbatches(plan, BATCH))
    if reason:
        row.note = f"refused: {reason}"
        return row
    row.job = program_job(Job.make(model, cluster, plan, BATCH))
    r = simulate(row.job, "analytic")
    row.predicted_s, row.predicted_mib = r.step_time, r.peak_memory / MiB
    return row


def measure(row: Row, run_dir: Path, steps: int | None) -> None:
    """Emit and run the plan; fill in the measured step time and peak memory."""
    assert row.job is not None and row.predicted_s
    write_run_dir(row.job, simulate(row.job, "analytic").to_dict(), run_dir)
    n = steps or max(MIN_STEPS, min(MAX_STEPS, math.ceil(TIMED_S / row.predicted_s)))
    row.load = os.getloadavg()[0]
    try:
        r = run_and_verify(run_dir, steps=n, timeout_s=600, log=lambda m: None, check_steps=0)
    except Exception as e:  # a failed run is a row of the table, not the end of it
        row.note = f"failed: {type(e).__name__}: {str(e)[:100]}"
        return
    row.measured_s = r.get("measured_step_time_s")
    row.speed, row.at_speed_s = r.get("host_speed"), r.get("predicted_step_time_at_host_speed_s")
    gib = r.get("measured_peak_memory_gib")
    row.measured_mib = gib * 1024 if gib is not None else None


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[Row]) -> str:
    head = (
        f"{'plan':<26} {'load':>5} {'meas s':>8} {'pred s':>8} {'error':>8} {'speed':>6} {'at speed':>8} "
        f"{'error':>8} {'meas MiB':>9} {'pred MiB':>9} {'error':>8}  target  at speed"
    )
    lines = [head]
    verdict = lambda ok: "-" if ok is None else ("ok" if ok else "MISSED")
    for r in rows:
        lines.append(
            f"{r.text:<26} {fmt(r.load, '5.2f')} {fmt(r.measured_s, '8.4f')} {fmt(r.predicted_s, '8.4f')} "
            f"{fmt(r.time_error(), '+7.1f')}% {fmt(r.speed, '6.2f')} {fmt(r.at_speed_s, '8.4f')} "
            f"{fmt(r.time_error(True), '+7.1f')}% {fmt(r.measured_mib, '9.1f')} {fmt(r.predicted_mib, '9.1f')} "
            f"{fmt(r.memory_error(), '+7.1f')}%  {verdict(r.ok()):<7} {verdict(r.ok(True))} {r.note}"
        )
    done = [r for r in rows if r.ok() is not None]
    for at_speed, what in ((False, "the profile's prediction"), (True, "the prediction at the host's speed")):
        scored = [r for r in done if r.ok(at_speed) is not None]
        if scored:
            errors = [r.time_error(at_speed) or 0.0 for r in scored]
            lines.append(
                f"{what}: {sum(bool(r.ok(at_speed)) for r in scored)} of {len(scored)} runs within both targets; "
                f"step-time errors {min(errors):+.1f}% .. {max(errors):+.1f}%"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1, help="runs of every plan (each its own row)")
    ap.add_argument("--only", action="append", default=[], help="run only the plans containing this text")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (default: about 3 s)")
    ap.add_argument("--node", default=NODE, help=f"node profile to predict with (default {NODE})")
    a = ap.parse_args(argv)
    # autoplan run predicts, and checks the host's speed, against this node too (autoplan.verify.cpu_job)
    os.environ["AUTOPLAN_CPU_NODE"] = a.node
    texts = [t for t in plan_texts() if not a.only or any(o in t for o in a.only)]
    rows = [predict(t, a.node) for t in texts for _ in range(max(1, a.repeats))]  # all before any run
    with tempfile.TemporaryDirectory(prefix="autoplan-zero-matrix-") as tmp:
        for i, row in enumerate(rows):
            if row.job is not None:
                measure(row, Path(tmp) / f"run{i}", a.steps)
                print(table([row]).splitlines()[1], flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
