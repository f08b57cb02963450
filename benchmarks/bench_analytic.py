"""Benchmark of the analytic estimator (docs/design.md section 7). Run: python benchmarks/bench_analytic.py

1. Throughput: analytic estimates per second over the whole plan space
   (autoplan.space.enumerate_plans, no pins) of
   - gpt-1t on 384 dgx-a100-80gb nodes (3072 GPUs), B = 3072   (the scalar reference: >= 10,000 plans/s;
     the planner scores with simulator.analytic.batch, measured by bench_speed.py)
   - gpt3-175b on 128 dgx-a100-80gb nodes (1024 GPUs), B = 1536
   in one process, caches cold at the start, as one search worker sees them. The rate is per
   CPU-second of the (single-threaded) loop; the wall-clock rate is printed next to it.
2. Accuracy: predicted tflops_per_gpu for the Megatron-LM rows of published.yaml (Narayanan
   et al. 2021, Table 1) with the row's t and p, zero=0, ckpt=full, 1F1B and the microbatch
   size (a divisor of B/d, <= 16) that fits and runs fastest, next to the published figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _accuracy_data as data

from autoplan.space import MAX_MB, enumerate_plans
from hwprofiles.load import load_cluster
from hwprofiles.units import GiB
from simulator.analytic import estimate
from simulator.job import Job
from simulator.model_files import load_model

TARGET_PLANS_PER_S = 10_000
SPACES = [("gpt-1t", 384, 3072), ("gpt3-175b", 128, 1536)]


def throughput(name: str, nodes: int, B: int) -> float:
    model = load_model(name)
    cluster = load_cluster("dgx-a100-80gb", nodes)
    t0 = time.perf_counter()
    plans = enumerate_plans(model, cluster.num_gpus, B, {})
    t1, c1 = time.perf_counter(), time.process_time()
    fits = 0
    for plan in plans:
        fits += estimate(Job(model, cluster, plan, B)).fits
    t2, c2 = time.perf_counter(), time.process_time()
    # the loop is single-threaded: CPU time is the wall time of an idle core, and unlike wall
    # time it does not count the time other processes on a shared machine take from us
    rate, wall_rate = len(plans) / (c2 - c1), len(plans) / (t2 - t1)
    print(
        f"{name:10s} {cluster.num_gpus:5d} GPUs  B={B:5d}  {len(plans):7,d} plans ({fits:,d} fit)  "
        f"enumerate {t1 - t0:5.2f} s  estimate {c2 - c1:5.2f} s CPU ({t2 - t1:5.2f} s wall)  "
        f"-> {rate:9,.0f} plans/s ({wall_rate:,.0f}/s wall)"
    )
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()

    print("== analytic estimator throughput (full plan space, one process) ==")
    rates = [throughput(*space) for space in SPACES]
    ok = rates[0] >= TARGET_PLANS_PER_S
    print(f"target >= {TARGET_PLANS_PER_S:,d} plans/s on gpt-1t: {'PASS' if ok else 'FAIL'} ({rates[0]:,.0f})")

    print()
    print("== Megatron-LM 2021 (Table 1) rows as run then: t, p, zero=0, ckpt=full, sp=0, 1F1B, no DP overlap ==")
    print(
        f"{'params':>8s} {'t':>2s} {'p':>3s} {'d':>4s} {'gpus':>5s} {'B':>5s} {'mb':>3s} {'peak GiB':>8s} "
        f"{'predicted':>9s} {'published':>9s} {'error':>7s}"
    )
    errors = []
    for row in data.published_rows():
        found = data.megatron_1f1b_best(row, MAX_MB)
        if found is None:
            print(f"{row.params_B:7.1f}B: no microbatch size fits")
            continue
        job, r = found
        err = (r.tflops_per_gpu - row.tflops_per_gpu) / row.tflops_per_gpu * 100
        errors.append(abs(err))
        print(
            f"{row.params_B:7.1f}B {row.t:2d} {row.p:3d} {job.plan.d:4d} {row.gpus:5d} {row.batch:5d} {job.plan.mb:3d} "
            f"{r.peak_memory / GiB:8.1f} {r.tflops_per_gpu:9.1f} {row.tflops_per_gpu:9.1f} {err:+6.1f}%"
        )
    within = sum(e <= 10 for e in errors)
    print(
        f"rows within 10% (docs/design.md target): {within}/{len(errors)}; mean |error| {sum(errors) / len(errors):.1f}%, "
        f"max {max(errors):.1f}%"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
