"""How many all-gathers and reduce-scatters FSDP2 issues per step in autoplan's program, beside
the count the cost model prices (simulator.cost.zero3.gathers_per_step, a reduce-scatter per unit
and microbatch or, under a pipeline, per unit and step), on the tiny model's CPU plans.

    python benchmarks/fsdp2_pipeline_probe.py [PLAN ...]

Each plan is emitted and run by ``autoplan run`` (benchmarks/cpu_zero_matrix.py) with a
``sitecustomize`` on the workers' path that counts the calls of ``torch.distributed``'s
``all_gather_single`` and ``reduce_scatter_single`` (FSDP2's default collectives,
torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) in every rank; a rank's count over its
warm-up and timed steps is taken from two runs, of 4 and of 8 timed steps, and their difference
divided by 4: the collectives of a step in steady state (the first step gathers more). Under a pipeline (p > 1) the program runs
``torch.distributed.pipelining``, whose stages turn FSDP2's gradient sync and its reshard after
backward off for every microbatch but the last and reduce all gradients once after the last
(torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``, ``perform_reduce_grad``).
Not run in CI (about 15 s per plan).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_zero_matrix import BATCH, environment, measure, predict

from autoplan.runtime.rank import RankLayout, chunk_layer_ids
from simulator.cost.fsdp2_sync import plan_deferred_sync
from simulator.cost.zero3 import gathers_per_step, units
from simulator.plan import parse_plan

PLANS = (
    "t=1,p=1,d=2,mb=2,zero=2",
    "t=1,p=1,d=2,mb=2,zero=3",
    "t=1,p=2,d=2,mb=2,zero=2",
    "t=1,p=2,d=2,mb=2,zero=3",
    "t=1,p=2,d=2,mb=1,zero=3",
    "t=1,p=2,d=2,mb=1,zero=3,schedule=gpipe",
    "t=1,p=2,d=2,mb=1,zero=2,v=2,schedule=interleaved",
    "t=1,p=2,d=2,mb=1,zero=3,v=2,schedule=interleaved",
)
STEPS = (4, 8)
NAMES = ("all_gather_single", "reduce_scatter_single")

COUNTER = """import atexit, collections, json, os
import torch.distributed as dist
_counts = collections.Counter()
def _counted(name):
    original = getattr(dist, name)
    def call(*args, **kwargs):
        _counts[name] += 1
        return original(*args, **kwargs)
    return call
for _name in NAMES:
    setattr(dist, _name, _counted(_name))
if "RANK" in os.environ:
    atexit.register(lambda: open(os.path.join(OUT, "rank" + os.environ["RANK"] + ".json"), "w").write(json.dumps(_counts)))
"""


def modelled(text: str) -> tuple[float, float]:
    """(all-gathers, reduce-scatters) per step of rank 0 as the cost model prices them for
    autoplan's program: per unit (simulator.cost.zero3.units of each of its chunks),
    simulator.cost.zero3.gathers_per_step and one reduce-scatter per microbatch, or per step with
    the sync deferred (simulator.cost.fsdp2_sync.deferred_sync)."""
    from autoplan.runtime.support import program_job
    from hwprofiles.load import load_cluster
    from simulator.job import Job
    from simulator.model_files import load_model

    model = load_model("tiny")
    ranks = math.prod(int(kv.split("=")[1]) for kv in text.split(",") if kv[0] in "tpd")
    plan, m = parse_plan(text, model, ranks, BATCH)
    job = program_job(Job.make(model, load_cluster("localhost-cpu", gpus_per_node=ranks), plan, BATCH))
    deferred = plan_deferred_sync(plan, job.runtime)
    layout = RankLayout.of(plan, 0)
    n_units = 0
    for chunk in layout.chunks:
        layers = chunk_layer_ids(model, plan, chunk)
        n_units += units(len(layers), layers.start == 0, layers.stop == model.num_layers)
    return float(n_units * gathers_per_step(plan.zero, m, deferred)), float(n_units * (1 if deferred else m))


def count_run(text: str, steps: int) -> dict[str, int] | None:
    """Rank 0's calls of each of :data:`NAMES` in a run of ``text`` with ``steps`` timed steps
    (module docstring), None when the run failed."""
    with tempfile.TemporaryDirectory(prefix="autoplan-fsdp2-probe-") as tmp:
        site, out = Path(tmp) / "site", Path(tmp) / "counts"
        site.mkdir()
        out.mkdir()
        (site / "sitecustomize.py").write_text(f"NAMES = {NAMES!r}\nOUT = {str(out)!r}\n" + COUNTER)
        row = predict(text)
        saved = os.environ.get("PYTHONPATH")
        with environment({"PYTHONPATH": str(site) + (os.pathsep + saved if saved else "")}):
            measure(row, Path(tmp) / "run", steps)
        counts = out / "rank0.json"
        if row.note or not counts.exists():
            return None
        found = json.loads(counts.read_text())
        return {name: int(found.get(name, 0)) for name in NAMES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plans", nargs="*", default=list(PLANS))
    a = ap.parse_args(argv)
    print(f"{'plan':<50} {'gathers/step':>13} {'modelled':>9} {'scatters/step':>14} {'modelled':>9}")
    for text in a.plans:
        row = predict(text)
        if row.job is None:
            print(f"{text:<50} {row.note}")
            continue
        runs = [count_run(text, steps) for steps in STEPS]
        if any(r is None for r in runs):
            print(f"{text:<50} no counts (a run failed)")
            continue
        per_step = [(runs[1][name] - runs[0][name]) / (STEPS[1] - STEPS[0]) for name in NAMES]
        gathers, scatters = modelled(text)
        print(f"{text:<50} {per_step[0]:>13.1f} {gathers:>9.1f} {per_step[1]:>14.1f} {scatters:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
