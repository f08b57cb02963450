"""With free communication and uniform stages, the DES bubble is the textbook one:
(p-1)/m for GPipe and 1F1B, (p-1)/(v m) for the interleaved schedule."""

from __future__ import annotations

import pytest

from hwprofiles import load_cluster
from simulator.des import simulate_des
from simulator.des.program import DesOptions
from simulator.job import Job
from simulator.plan import Plan
from simulator.specs import ModelSpec

MODEL = ModelSpec(
    name="uniform", num_layers=24, hidden_size=512, num_attention_heads=8, vocab_size=1024, seq_length=256
)
FREE = DesOptions(free_comm=True, skip_embedding_head=True)


@pytest.mark.parametrize(
    "schedule,p,m,v",
    [
        ("gpipe", 4, 8, 1),
        ("gpipe", 2, 3, 1),
        ("gpipe", 8, 16, 1),
        ("1f1b", 4, 8, 1),
        ("1f1b", 8, 16, 1),
        ("1f1b", 4, 2, 1),
        ("1f1b", 2, 24, 1),
        ("interleaved", 4, 8, 2),
        ("interleaved", 4, 8, 3),
        ("interleaved", 2, 4, 2),
        ("interleaved", 4, 4, 2),
        ("interleaved", 2, 6, 4),
    ],
)
def test_bubble_fraction(schedule, p, m, v):
    cluster = load_cluster("dgx-a100-80gb", 1)
    d = cluster.num_gpus // p if cluster.num_gpus % p == 0 else 1
    t = cluster.num_gpus // (p * d)
    plan = Plan(t=t, p=p, d=d, v=v, schedule=schedule)
    r = simulate_des(Job.make(MODEL, cluster, plan, m * d), options=FREE)
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m), rel=1e-9, abs=1e-12)
    b = r.time_breakdown
    assert b["bubble"] == pytest.approx(r.bubble_fraction * (b["compute"] + b["recompute"] + b["tp_comm"]))
    assert sum(b.values()) == pytest.approx(r.step_time)


def test_recomputation_is_busy_time_not_bubble():
    cluster = load_cluster("dgx-a100-80gb", 1)
    plan = Plan(t=2, p=4, d=1, ckpt="full")
    r = simulate_des(Job.make(MODEL, cluster, plan, 8), options=FREE)
    assert r.time_breakdown["recompute"] > 0
    assert r.bubble_fraction == pytest.approx(3 / 8)
