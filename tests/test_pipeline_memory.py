"""The partition's optimum under memory limits in closed form (autoplan.pipeline_memory):
hand-derived recomputation and splits, and never worse than CP-SAT's solve of the same model."""

from __future__ import annotations

import pytest

from autoplan import partition
from autoplan.pipeline_memory import Row, least_recompute, memory_balanced
from hwprofiles import load_cluster
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan

UNLIMITED = Row(per_layer=10, per_full=-5, per_sel=0, any_full=0, limit=10**9)


def test_the_cheapest_recomputation_that_fits():
    """4 layers of 10 units, a full recompute saving 6 and a selective one 2, 1 more where any
    layer is fully recomputed, limit 30; full costs 5 us, selective 1. F = 0: 10 over, S = 5 > 4
    layers. F = 1: 40 - 6 + 1 - 30 = 5 over, S = 3: 5 + 3 = 8 us. F = 2: fits with S = 0, 10 us.
    F >= 3 costs more. So F = 1, S = 3, 8 us; pinned full recompute costs 4 * 5 = 20 us."""
    row = Row(per_layer=10, per_full=-6, per_sel=-2, any_full=1, limit=30)
    found = least_recompute([row], 4, 5, 1, "choose")
    assert found is not None and (found.time, found.full, found.sel) == (8, 1, 3)
    pinned = least_recompute([row], 4, 5, 1, "full")
    assert pinned is not None and (pinned.time, pinned.full, pinned.sel) == (20, 4, 0)
    assert least_recompute([row], 4, 5, 1, "none") is None  # 40 > 30


def test_a_hand_derived_split_that_recomputes():
    """2 devices, 4 layers of 10 us, m = 3; device 0 holds 10 units (a layer takes 10, a fully
    recomputed one saves 5 at 4 us), device 1 holds 20. (1, 3): device 1 needs F = 2, times
    (10, 38): 2 * 38 + 48 = 124. (2, 2): device 0 needs F = 2, times (28, 20): 2 * 28 + 48 = 104.
    (3, 1): device 0 cannot fit 3. So (2, 2), device 0 fully recomputing both, objective 104."""
    device0 = Row(per_layer=10, per_full=-5, per_sel=0, any_full=0, limit=10)
    device1 = Row(per_layer=10, per_full=-5, per_sel=0, any_full=0, limit=20)
    found = memory_balanced([[device0], [device1]], [0, 0], 10, (4, 1), 4, 3, "choose")
    assert found is not None
    assert (found.layers, found.full, found.sel, found.objective) == ((2, 2), (2, 0), (0, 0), 104)


def test_without_a_binding_limit_the_memory_free_optimum():
    """Unlimited memory: nothing is recomputed and the split is the balanced one, 3 layers of 10
    us over 2 devices with m = 3: (1, 2), times (10, 20): 2 * 20 + 30 = 70."""
    found = memory_balanced([[UNLIMITED], [UNLIMITED]], [0, 0], 10, (4, 1), 3, 3, "choose")
    assert found is not None and (found.layers, found.full, found.objective) == ((1, 2), (0, 0), 70)


def test_a_device_that_cannot_hold_one_layer_is_left_to_cp_sat():
    tight = Row(per_layer=10, per_full=-1, per_sel=0, any_full=0, limit=5)
    assert memory_balanced([[tight], [UNLIMITED]], [0, 0], 10, (4, 1), 3, 3, "choose") is None


@pytest.mark.parametrize(
    "nodes, text",
    [
        (115, "t=5,p=23,d=8,mb=1,zero=1,ckpt=full"),
        (190, "t=5,p=19,d=16,mb=1,zero=1,ckpt=full"),
        (295, "t=5,p=59,d=8,mb=2,zero=1,ckpt=full"),
    ],
)
def test_never_worse_than_cp_sat_on_gpt_1t(nodes, text):
    """Plans of gpt-1t's sweep whose memory-free optimum does not fit (prime pipeline depths):
    the closed form's split fits every device's memory rows and its objective is never above
    CP-SAT's (which stops within 0.1% of the optimum, or at its work limit)."""
    model = load_model("gpt-1t")
    cluster = load_cluster("dgx-a100-80gb", nodes)
    job = Job(model, cluster, parse_plan(text, model, cluster.num_gpus, 3072)[0], 3072)
    times, memory = partition.LayerTimes.of(job), partition._device_memory(job)
    assert not partition._fits(memory, *partition._time_optimum(job, times, True)[:3])
    closed = partition._memory_optimum(job, times, memory, True)
    solved = partition._solve(job, times, memory, True, 10.0)
    assert closed is not None and solved is not None
    assert partition._fits(memory, *closed[:3]) and sum(closed[0]) == model.num_layers
    assert closed[3] <= solved[3] * (1 + 1e-9)


def _brute_force(rows, extras, per_layer, costs, layers, m, recompute="choose"):
    """The least objective over every split and every device's (F, S) (pinned: F or S = N, or
    none), by enumeration."""
    best = None
    p = len(rows)

    def splits(left, devices):
        if devices == 1:
            yield (left,)
            return
        for n in range(1, left - devices + 2):
            for rest in splits(left - n, devices - 1):
                yield (n, *rest)

    for split in splits(layers, p):
        times = []
        for n, device_rows, x in zip(split, rows, extras):
            pinned = {"full": (n, 0), "selective": (0, n), "none": (0, 0)}.get(recompute)
            fitting = [
                f * costs[0] + s * costs[1]
                for f in range(n + 1)
                for s in range(n - f + 1)
                if (pinned is None or (f, s) == pinned)
                and all(
                    n * r.per_layer + f * r.per_full + s * r.per_sel + (r.any_full if f else 0) <= r.limit
                    for r in device_rows
                )
            ]
            if not fitting:
                break
            times.append(n * per_layer + x + min(fitting))
        else:
            value = (m - 1) * max(times) + sum(times)
            best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("recompute", ["choose", "full", "selective", "none"])
def test_the_optimum_of_every_small_case_by_enumeration(recompute):
    """Random small pipelines (2-3 devices, 4-7 layers, 1-3 memory rows each, m of 1-6): the
    closed form's objective is the least over every split and recomputation (chosen, or pinned
    as the plan's ckpt), or None exactly where nothing fits."""
    import random

    rng = random.Random(7)
    for _ in range(300):
        p, layers, m = rng.randint(2, 3), rng.randint(4, 7), rng.randint(1, 6)
        rows = [
            [
                Row(rng.randint(5, 12), -rng.randint(0, 5), -rng.randint(0, 3), rng.randint(0, 4), rng.randint(15, 60))
                for _ in range(rng.randint(1, 3))
            ]
            for _ in range(p)
        ]
        extras = [rng.randint(0, 30) for _ in range(p)]
        costs = (rng.randint(5, 15), rng.randint(1, 5))
        found = memory_balanced(rows, extras, 10, costs, layers, m, recompute)
        expected = _brute_force(rows, extras, 10, costs, layers, m, recompute)
        assert (found.objective if found else None) == expected, (rows, extras, costs, layers, m)
