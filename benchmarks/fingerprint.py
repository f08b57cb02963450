"""Every analytic and DES figure of a sample of plans at full precision, to show that a refactor
changes no result: the check issue 32 (one home per cost rule) was held to.

    python benchmarks/fingerprint.py --against REV          # this checkout vs a git revision
    python benchmarks/fingerprint.py --out figures.json     # just write this checkout's figures

For 9 model/cluster spaces x 7 runtimes, a seeded sample of the search space's plans (``--plans``
per space and runtime, default 150): the scalar estimate's step time, peak memory, fit, FLOPs,
bubble, time and memory breakdowns and extra figures; the batch estimate's step time, peak memory
and fit; and the DES of the first two fitting plans. With ``--against`` the same plans are run on
the revision (a temporary git worktree: this checkout's sample, so that a search space that
changed between them still compares every record) and the two are compared value by value: it
prints how many differ, by at most how much, and where. About 6 minutes per checkout on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: run inside a checkout (it may be an older revision: imports fall back to where things lived)
FIGURES = r"""
import json, math, random, sys
from dataclasses import replace
from autoplan.space import enumerate_plans, offloads, precisions
from hwprofiles.load import load_cluster
from simulator.analytic import estimate
from simulator.analytic.batch import estimate_batch
from simulator.des.simulate import simulate_des
from simulator.job import Job
try:
    from simulator.runtime_spec import DEEPSPEED_ZERO3, NO_DP_OVERLAP, OVERLAPPED
except ImportError:
    from simulator.job import DEEPSPEED_ZERO3, NO_DP_OVERLAP, OVERLAPPED
try:
    from simulator.model_files import load_model
except ImportError:
    from simulator.specs import load_model

PROGRAM = replace(NO_DP_OVERLAP, name="torch-program", cross_entropy="torch", weight_copy_bytes=2.0,
                  states="fp32-params", zero2="fsdp2")
RUNTIMES = [OVERLAPPED, NO_DP_OVERLAP, DEEPSPEED_ZERO3, replace(OVERLAPPED, name="fused", cross_entropy="fused"),
            PROGRAM, replace(PROGRAM, name="eager", layer_kernels="eager", dp_overlap=True),
            replace(OVERLAPPED, name="nocache", fp8_weight_cache=False, sharded_reduce_bytes=2)]
SPACES = [("gpt3-175b", "dgx-a100-80gb", 128, 1536), ("gpt-1t", "dgx-a100-80gb", 384, 3072),
          ("llama2-70b", "dgx-h100", 16, 512), ("llama3-8b", "hgx-a100-40gb-roce", 4, 256),
          ("llama2-7b", "pcie-a100-80gb", 2, 64), ("gpt3-175b", "dgx2-v100", 32, 512),
          ("mixtral-8x7b", "dgx-h100", 8, 256), ("tiny", "localhost-cpu", 1, 16), ("tiny", "localhost-cpu", 1, 8)]
try:
    from simulator.plan import parse_plan
except ImportError:
    from simulator.specs import parse_plan
full = lambda x: repr(float(x))
out, per = {}, int(sys.argv[2])
given = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None  # another checkout's record keys
def given_plans(prefix, model, gpus, gb):  # the plans of the given records whose keys start with prefix
    return [parse_plan(k[len(prefix):], model, gpus, gb)[0] for k in given if k.startswith(prefix)]
for name, node, nodes, gb in SPACES:
    model, cluster = load_model(name), load_cluster(node, nodes)
    if given is None:
        plans = enumerate_plans(model, cluster.num_gpus, gb, {}, cluster.gpus_per_node,
                                precisions(cluster.gpu, {}), offloads(cluster.node, {}))
    for rt in RUNTIMES:
        prefix = f"{name}|{node}|{nodes}|{gb}|{rt.name}|"
        if given is None:
            sample = random.Random(f"{name}{node}{nodes}{rt.name}").sample(plans, min(per, len(plans)))
        else:  # exactly the plans the other checkout sampled
            sample = given_plans(prefix, model, cluster.num_gpus, gb)
        b = estimate_batch(model, cluster, sample, gb, rt)
        for i, q in enumerate(sample):
            s = estimate(Job(model, cluster, q, gb, rt))
            out[f"{name}|{node}|{nodes}|{gb}|{rt.name}|{q.to_string()}"] = {
                "batch": [full(b.step_time[i]), full(b.peak_memory[i]), bool(b.fits[i])],
                "scalar": [full(s.step_time), full(s.peak_memory), s.fits, full(s.executed_flops),
                           full(s.bubble_fraction)],
                "time": {k: full(v) for k, v in s.time_breakdown.items()},
                "memory": {k: full(v) for k, v in s.memory_breakdown.items()},
                "extra": {k: repr(v) for k, v in s.extra.items()}}
        if given is None:
            fitting = [q for i, q in enumerate(sample) if b.fits[i] and math.isfinite(b.step_time[i])][:2]
        else:
            fitting = given_plans("DES|" + prefix, model, cluster.num_gpus, gb)
        for q in fitting:
            d = simulate_des(Job(model, cluster, q, gb, rt))
            out[f"DES|{name}|{node}|{nodes}|{gb}|{rt.name}|{q.to_string()}"] = {
                "des": [full(d.step_time), full(d.peak_memory), d.fits],
                "time": {k: full(v) for k, v in d.time_breakdown.items()}}
json.dump(out, open(sys.argv[1], "w"), sort_keys=True)
"""


def figures(root: Path, path: Path, plans: int, keys: Path | None = None) -> dict:
    """The figures of the code under ``root``, written to and read back from ``path``; with
    ``keys`` (a JSON list of record keys), of exactly those plans instead of a sample."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    args = [str(path), str(plans), *([str(keys)] if keys else [])]
    r = subprocess.run([sys.executable, "-c", FIGURES, *args], cwd=root, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"figures failed in {root}: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(path.read_text())


def _leaves(record: object, path: str = ""):
    """(path, value) of every figure of a record."""
    if isinstance(record, dict):
        for key in sorted(record):
            yield from _leaves(record[key], f"{path}.{key}")
    elif isinstance(record, list):
        for i, value in enumerate(record):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, record


def _relative(a: object, b: object) -> float:
    """0 for equal figures, their relative difference for numbers, inf for other differences."""
    if a == b:
        return 0.0
    try:
        x, y = float(a), float(b)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.inf
    if math.isnan(x) and math.isnan(y):
        return 0.0
    return abs(x - y) / max(abs(x), abs(y))


def compare(then: dict, now: dict) -> list[str]:
    """What differs between two fingerprints, per kind of figure (the first key part)."""
    lines = [f"records: {len(now)} (only in one of them: {len(set(then) ^ set(now))})"]
    worst: dict[str, tuple[int, float, str]] = {}
    for key in sorted(set(then) & set(now)):
        for (path, a), (_, b) in zip(_leaves(then[key]), _leaves(now[key])):
            rel = _relative(a, b)
            if rel:
                kind = path.split("[")[0].split(".")[1]
                count, most, where = worst.get(kind, (0, 0.0, ""))
                worst[kind] = (count + 1, max(most, rel), key if rel > most else where)
    for kind in ("scalar", "time", "memory", "extra", "batch", "des"):
        count, most, where = worst.get(kind, (0, 0.0, ""))
        lines.append(
            f"{kind:8s} {count:6d} values differ" + (f", at most {most:.2g} relative ({where})" if count else "")
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REV", help="compare with the figures of this git revision")
    ap.add_argument("--out", type=Path, help="also keep this checkout's figures in this file")
    ap.add_argument("--plans", type=int, default=150, help="plans per space and runtime")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        now = figures(ROOT, a.out or Path(tmp) / "now.json", a.plans)
        if not a.against:
            print(f"{len(now)} records")
            return 0
        tree = Path(tmp) / "rev"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), a.against], cwd=ROOT, check=True, capture_output=True
        )
        keys = Path(tmp) / "keys.json"
        keys.write_text(json.dumps(sorted(now)))
        try:  # the plans this checkout sampled: a search space that changed samples others
            then = figures(tree, Path(tmp) / "then.json", a.plans, keys)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    print("\n".join(compare(then, now)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
