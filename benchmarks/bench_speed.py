"""Speed benchmark (issue 16): every figure of the planner's speed in one run.

    python benchmarks/bench_speed.py [--against REV] [--repeat N]

1. the analytic model's plans per second over the whole plan space of gpt-1t on 3,072 GPUs and
   gpt3-175b on 1,024 (one process, caches cold, as one search worker starts; the array path
   simulator.analytic.batch where the code has it, given the plans as the search's workers
   score them (a plan table, autoplan.space.plan_table, where the code has one), and the scalar
   reference beside it);
2. one DES iteration of gpt3-175b on 1,024 GPUs (t=8,p=16,ckpt=full, as benchmarks/bench_des.py)
   and of gpt-1t on 3,072 GPUs (the plan `autoplan plan` picks for it), the topology built,
   the transfer classes not (as a first simulation of the layout), best of --repeat;
3. `autoplan plan` wall time and peak memory (the largest RSS of the main process and of any
   worker) for the main job (gpt3-175b, 128 dgx-a100-80gb nodes, B = 1536) and the 1T job
   (gpt-1t, 384 nodes, B = 3072), as ``python -m autoplan`` runs it (interpreter start to exit),
   best of --repeat;
4. with ``--sizing``: the cluster-size sweeps of issue 35 as ``autoplan plan --nodes A:B`` runs them
   (gpt3-175b over every node count from 16 to 512, gpt-1t from 64 to 1,024, dgx-a100-80gb
   nodes), best of --repeat. Targets: 5 s and 10 s; a sweep costs one single-process search per size
   (a median of 28 ms for 175B's, 0.2-0.45 s for its sizes of 100,000 plans) over the cores
   (2 cores: 48 s and 185 s on 2026-11-28, 7.1 s and 9.4 s on 2026-11-29 at b938939, 5.4 s and
   7.3 s after it where b938939 took 7.7 s and 10.0 s; 4.7-4.9 s and 5.5-5.7 s on 2026-11-29 once a size
   prices only the plans whose step-time floor could lead, where d8086ed took 5.1 s and 5.5-5.7 s, run
   alternately; 5.1-5.7 s and 6.3-7.0 s in three runs on 2026-11-30 at the VM's slower pace, once
   the pricing rounds read the floor's stage terms and a size's block times are paced at once,
   where 57669f8 took 5.9-6.5 s and 7.1-7.6 s, run alternately; 4.1-4.7 s and 5.0-6.2 s at its
   faster paces later that day, where fdba58a took 4.4-4.9 s and 5.3-6.3 s (5.1 s and 6.6 s in a
   slower run, fdba58a 5.4 s and 7.0 s); 3.1 s and 3.9 s at 14daecf on a 2-core AMD EPYC VM, where
   2b2bcba took 3.2 s and 4.0 s; the sizes share what does not depend on the GPU count:
   docs/design.md section 5.1).

With ``--against REV`` the same figures are measured for the code at git revision REV (checked
out into a temporary worktree; each measurement runs in a subprocess with that tree first on
the path, the two trees' runs alternating) and printed beside the current ones, with the ratio. Targets (a 2-core machine like
CI's): plan gpt-1t <= 2 s, the main job <= 1 s, DES 175B/1,024 <= 0.5 s, analytic >= 100,000
plans/s, plan gpt-1t peak memory <= 1 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ANALYTIC = """
import json, sys, time
from autoplan.space import enumerate_plans
from hwprofiles.load import load_cluster
from simulator.analytic import estimate
from simulator.job import Job
try:
    from simulator.model_files import load_model
except ImportError:  # a revision that reads models in simulator.specs
    from simulator.specs import load_model
name, nodes, B, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model, cluster = load_model(name), load_cluster("dgx-a100-80gb", nodes)
try:
    plans = enumerate_plans(model, cluster.num_gpus, B, {}, cluster.gpus_per_node)
except TypeError:  # before hybrid sharding
    plans = enumerate_plans(model, cluster.num_gpus, B, {})
from simulator.analytic.batch import estimate_batch  # imported (with numpy) before the clock starts, as in a worker
try:  # the plans as the search's workers score them: a plan table, where the code has one
    from autoplan.space import plan_table, shapes
    layouts = list(shapes(model, cluster.num_gpus, B, {}))
    scored = plan_table(model, layouts, {}, cluster.gpus_per_node)
    assert list(scored) == plans
except ImportError:
    scored = plans
t0 = time.process_time()
if path == "batch":
    estimate_batch(model, cluster, scored, B)
else:
    for plan in plans:
        estimate(Job(model, cluster, plan, B))
print(json.dumps({"plans": len(plans), "cpu_s": time.process_time() - t0}))
"""

DES = """
import json, sys, time
from hwprofiles.load import load_cluster
from simulator.des import simulate_des
from simulator.job import Job
from simulator.plan import parse_plan
try:
    from simulator.model_files import load_model
except ImportError:  # a revision that reads models in simulator.specs
    from simulator.specs import load_model
name, nodes, B, text, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
model, cluster = load_model(name), load_cluster("dgx-a100-80gb", nodes)
plan, _ = parse_plan(text, model, cluster.num_gpus, B)
job = Job(model, cluster, plan, B)
simulate_des(job)  # the topology is built once per cluster
try:  # simulator.des.transfers keeps a layout's transfer classes across simulations: built anew each run
    from simulator.des.transfers import forget_built
except ImportError:  # a revision that keeps none
    def forget_built():
        pass
best = float("inf")
for _ in range(repeat):
    forget_built()
    t0 = time.perf_counter()
    r = simulate_des(job)
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"wall_s": best, "step_s": r.step_time, "events": r.extra["events"]}))
"""

PLAN = """
import atexit, json, resource, runpy, sys


def peak_memory():
    rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"rss_kib": rss}), file=sys.stderr)


atexit.register(peak_memory)
sys.argv = ["autoplan", "-q", "plan", *sys.argv[1:], "--json"]
runpy.run_module("autoplan", run_name="__main__")  # `python -m autoplan`, as that revision runs it, exit included
"""

JOBS = {
    "main job": ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "128", "--global-batch", "1536"],
    "1T job": ["--model", "gpt-1t", "--cluster", "dgx-a100-80gb", "--nodes", "384", "--global-batch", "3072"],
}
SWEEPS = {
    "sweep 175B, 16..512 nodes": [*JOBS["main job"][:-3], "16:512", "--global-batch", "1536"],
    "sweep 1T, 64..1024 nodes": [*JOBS["1T job"][:-3], "64:1024", "--global-batch", "3072"],
}
DES_RUNS = {
    "DES 175B on 1,024 GPUs": ("gpt3-175b", 128, 1536, "t=8,p=16,ckpt=full"),
    "DES 1T on 3,072 GPUs": ("gpt-1t", 384, 3072, "t=8,p=16,mb=1,zero=1,v=8,schedule=interleaved,sp=1"),
}


def _python(root: Path, code: str, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=root, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"benchmark step failed in {root}: {r.stderr.strip().splitlines()[-1:]}")
    return r


def measure(roots: list[Path], repeat: int, sizing: bool = False) -> list[dict[str, tuple[float, str]]]:
    """{figure: (value, unit)} for the code under each of ``roots``. Each timed figure's runs
    alternate between the trees (a shared VM's pace drifts by tens of percent within minutes:
    runs of one tree and then of the other would compare two paces)."""
    out: list[dict[str, tuple[float, str]]] = [{} for _ in roots]
    for name, nodes, B in (("gpt-1t", 384, 3072), ("gpt3-175b", 128, 1536)):
        for k, root in enumerate(roots):
            analytic = root / "simulator" / "analytic"
            has_batch = (analytic / "batch.py").exists() or (analytic / "batch").is_dir()
            for path in ("batch", "scalar") if has_batch else ("scalar",):
                r = json.loads(_python(root, ANALYTIC, [name, str(nodes), str(B), path]).stdout)
                out[k][f"analytic {name} ({path})"] = (r["plans"] / r["cpu_s"], "plans/s")
    for label, (name, nodes, B, text) in DES_RUNS.items():
        for k, root in enumerate(roots):
            r = json.loads(_python(root, DES, [name, str(nodes), str(B), text, str(repeat)]).stdout)
            out[k][label] = (r["wall_s"], "s")
    for label, args in JOBS.items():
        walls: list[list[float]] = [[] for _ in roots]
        rss: list[list[int]] = [[] for _ in roots]
        for _ in range(repeat):  # the whole command: interpreter start, imports, search, output
            for k, root in enumerate(roots):
                t0 = time.perf_counter()
                r = _python(root, PLAN, args)
                walls[k].append(time.perf_counter() - t0)
                rss[k].append(json.loads(r.stderr.strip().splitlines()[-1])["rss_kib"])
        for k in range(len(roots)):
            out[k][f"plan {label}"] = (min(walls[k]), "s")
            out[k][f"plan {label} peak memory"] = (max(rss[k]) / 2**20, "GiB")
    for label, args in SWEEPS.items() if sizing else ():
        walls = [[] for _ in roots]
        for _ in range(repeat):
            for k, root in enumerate(roots):
                t0 = time.perf_counter()
                _python(root, PLAN, args)
                walls[k].append(time.perf_counter() - t0)
        for k in range(len(roots)):
            out[k][label] = (min(walls[k]), "s")
    return out


def _worktree(rev: str, where: Path) -> Path:
    path = where / "rev"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True, capture_output=True)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REV", help="also measure the code at this git revision, and the ratio")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each timed figure (the best is reported)")
    ap.add_argument("--sizing", action="store_true", help="also time the cluster-size sweeps (figure 4; minutes)")
    a = ap.parse_args()
    then: dict[str, tuple[float, str]] = {}
    if a.against:
        with tempfile.TemporaryDirectory() as tmp:
            tree = _worktree(a.against, Path(tmp))
            try:
                now, then = measure([ROOT, tree], a.repeat, a.sizing)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    else:
        (now,) = measure([ROOT], a.repeat, a.sizing)
    print(f"{'figure':44s} {'this code':>14s}" + (f" {a.against[:12]:>14s} {'ratio':>7s}" if a.against else ""))
    for key, (value, unit) in now.items():
        line = f"{key:44s} {value:>10,.3f} {unit:<5s}" if unit != "plans/s" else f"{key:44s} {value:>10,.0f} {unit}"
        if key in then:
            old = then[key][0]
            better = value / old if unit == "plans/s" else old / value
            line += f" {old:>10,.3f}" if unit != "plans/s" else f" {old:>10,.0f}"
            line += f"     {better:5.2f}x"
        print(line)
    if a.against:
        print("(ratio > 1: this code is faster, or uses less memory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
