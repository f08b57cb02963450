"""The workers' scores, merged, are what ranking every plan at once gives (autoplan.scoring)."""

from __future__ import annotations

import pytest

from autoplan import space
from autoplan.scoring import Scored, objective_value, pareto_front, score_all
from autoplan.search import SearchOptions
from autoplan.workers import SHARED, can_fork
from hwprofiles.load import load_cluster
from simulator.analytic.batch import estimate_batch
from simulator.model_files import load_model
from simulator.plan import Plan

PAIRS = [  # model, node profile, node counts (the cost objective tries several), global batch, objective
    ("gpt3-175b", "dgx-a100-80gb", (16,), 512, "time"),
    ("llama2-7b", "dgx-h100", (2, 1), 64, "cost"),
    ("mixtral-8x7b", "dgx-h100", (4,), 256, "time"),
]
KEEP = 16


def _exhaustive(model, clusters, B, objective):
    """Every plan scored in one batch per node count, ranked at once (the search before its workers
    sent back summaries)."""
    scored = []
    for n, cluster in clusters.items():
        precs, offloads = space.precisions(cluster.gpu, {}), space.offloads(cluster.node, {})
        plans = space.enumerate_plans(model, cluster.num_gpus, B, {}, cluster.gpus_per_node, precs, offloads)
        r = estimate_batch(model, cluster, plans, B)
        scored += [Scored(p, n, *row) for p, row in zip(plans, zip(r.step_time, r.peak_memory, r.fits))]
    feasible = [s for s in scored if s.fits]
    gpn = next(iter(clusters.values())).gpus_per_node
    leaders = sorted(feasible, key=lambda s: objective_value(s.step_time, s.nodes, gpn, objective))
    return scored, leaders[:KEEP], pareto_front(feasible), min(scored, key=lambda s: s.peak_memory)


def _key(s: Scored) -> tuple:
    return (s.plan, s.nodes, s.step_time, s.peak_memory, s.fits)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}-{p[4]}")
@pytest.mark.parametrize("jobs", [1, 2])
def test_merged_scores_equal_the_exhaustive_ranking(pair, jobs):
    if jobs > 1 and not can_fork():
        pytest.skip("no fork start method")
    name, node, counts, B, objective = pair
    model = load_model(name)
    clusters = {n: load_cluster(node, n) for n in counts}
    first = clusters[counts[0]]
    precs, offloads = space.precisions(first.gpu, {}), space.offloads(first.node, {})
    SHARED.update(
        model=model, clusters=clusters, B=B, fix={}, opts=SearchOptions(), precs=precs, offloads=offloads, keep=None
    )
    layouts = {n: list(space.shapes(model, c.num_gpus, B, {})) for n, c in clusters.items()}
    got = score_all(layouts, KEEP, objective, jobs, False)
    scored, leaders, front, smallest = _exhaustive(model, clusters, B, objective)
    assert got.total == len(scored) and got.feasible == sum(s.fits for s in scored)
    assert [_key(s) for s in got.leaders] == [_key(s) for s in leaders]
    assert [_key(s) for s in got.front] == [_key(s) for s in front]
    assert got.smallest is not None and _key(got.smallest) == _key(smallest)
    assert got.offload == any(s.plan.offload != "none" for s in scored)


def test_pareto_front_by_hand():
    """(step, memory): (1, 9) (2, 5) (2, 7) (3, 5) (4, 1): (2, 7) and (3, 5) are beaten by (2, 5)."""
    rows = [(3, 5), (2, 7), (1, 9), (4, 1), (2, 5)]
    scored = [Scored(Plan(d=i + 1), 1, float(a), float(b), True) for i, (a, b) in enumerate(rows)]
    assert [(s.step_time, s.peak_memory) for s in pareto_front(scored)] == [(1, 9), (2, 5), (4, 1)]
