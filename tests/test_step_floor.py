"""The floor under a plan's step time (simulator.analytic.batch.terms.step_floor) and the search
that prices only the plans whose floor could lead (autoplan.scoring._leading, a sweep's sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan import scoring, space
from autoplan.frameworks import load_framework
from autoplan.frameworks.pricing import runtime_groups
from autoplan.scoring import score_all
from autoplan.search import SearchOptions
from autoplan.workers import SHARED
from hwprofiles.load import load_cluster
from simulator.analytic.batch import staged_groups
from simulator.analytic.pipeline import ScheduleKind, pipeline_floor
from simulator.model_files import load_model
from simulator.plan.table import PlanTable


def test_pipeline_floor_by_hand():
    """Stages of 1, 2 and 1 s per microbatch (max 2, sum 4), m = 4: 1F1B (m - 1) * 2 + 4 = 10;
    interleaved with v = 2, 4 * 2 + (4 - 2) / 2 = 9; ZB-H1 and ZB-V 4 * 2 = 8; GPipe, which skips
    the last microbatch's recomputation of at most 0.5 s, 10 - 0.5 = 9.5."""
    kinds = {
        "1f1b": ScheduleKind.of("1f1b", 1, 4),
        "interleaved": ScheduleKind.of("interleaved", 2, 4),
        "zbh1": ScheduleKind.of("zbh1", 1, 4),
        "zbv": ScheduleKind.of("zbv", 2, 4),
        "gpipe": ScheduleKind.of("gpipe", 1, 4),
    }
    v = {"interleaved": 2, "zbv": 2}
    got = {name: pipeline_floor(4, 2.0, 4.0, kind, v.get(name, 1), 0.5) for name, kind in kinds.items()}
    assert got == {"1f1b": 10.0, "interleaved": 9.0, "zbh1": 8.0, "zbv": 8.0, "gpipe": 9.5}


CASES = [  # model, node profile, nodes, global batch, framework
    ("gpt3-175b", "dgx-a100-80gb", 16, 512, None),
    ("llama2-7b", "dgx-h100", 2, 64, "megatron"),
    ("llama3-8b", "dgx-h100", 1, 32, "autoplan"),
    ("llama2-7b", "dgx-h100", 2, 64, "torchtitan"),
    ("tiny", "localhost-cpu", 1, 8, "autoplan"),
]


def _share(name: str, node: str, nodes: int, B: int, framework: str | None, pareto: bool = True):
    model, cluster = load_model(name), load_cluster(node, nodes)
    fw = load_framework(framework) if framework else None
    opts = SearchOptions(framework=fw, pareto=pareto)
    precs, offloads = space.precisions(cluster.gpu, {}), space.offloads(cluster.node, {})
    SHARED.update(
        model=model, clusters={nodes: cluster}, B=B, fix={}, opts=opts, precs=precs, offloads=offloads, keep=None
    )
    return model, cluster, opts, precs, offloads


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[4]}")
def test_the_floor_is_at_most_the_step_time(case):
    """Every plan that fits in GPU memory: floor <= step time, under each runtime its framework
    prices it with; the step times then read from the floor's stage terms are those priced
    without a floor (bit for bit)."""
    name, node, nodes, B, framework = case
    model, cluster, opts, precs, offloads = _share(name, node, nodes, B, framework)
    shapes = list(space.shapes(model, cluster.num_gpus, B, {}))
    plans: PlanTable = space.plan_table(model, shapes, {}, cluster.gpus_per_node, precs, offloads, None)
    groups = runtime_groups(opts.framework, opts.base_runtime, plans, cluster.node.backend)
    est = staged_groups(model, cluster, plans, B, groups)
    priced = est.priced()
    rows = np.flatnonzero(np.isfinite(priced.step_time))
    assert len(rows) > 10
    floor = est.floor(rows)
    assert (floor <= priced.step_time[rows] * (1 + 1e-12)).all()
    assert (floor > 0.3 * priced.step_time[rows]).mean() > 0.5  # a floor that prunes, not 0
    some = rows[::3]
    assert np.array_equal(est.step_times(some), priced.step_time[some])


LEAD_CASES = [
    *CASES[:4],
    ("mixtral-8x7b", "dgx-h100", 4, 256, None),  # expert parallelism: every plan priced whole
    ("gpt3-175b", "dgx-a100-80gb", 16, 512, "torchtitan"),  # its files refuse them all: the whole scan
]


@pytest.mark.parametrize("case", LEAD_CASES, ids=lambda c: f"{c[0]}-{c[4]}")
@pytest.mark.parametrize(("objective", "first"), [("time", 256), ("cost", 256), ("time", 8)])
def test_scores_without_the_front_lead_as_with_it(case, objective, first, monkeypatch):
    """The leaders, the plan passed over, the counts and the plan needing least memory are those of
    pricing every fitting plan, also when the rounds are many (``first``: the plans priced first);
    the front is left empty."""
    monkeypatch.setattr(scoring, "FIRST_PRICED", first)
    name, node, nodes, B, framework = case
    got = {}
    for pareto in (True, False):
        model, cluster, *_ = _share(name, node, nodes, B, framework, pareto)
        layouts = {nodes: list(space.shapes(model, cluster.num_gpus, B, {}))}
        got[pareto] = score_all(layouts, 16, objective, 1, False)
    full, lean = got[True], got[False]
    key = lambda s: (s.plan, s.step_time, s.peak_memory)
    assert [key(s) for s in lean.leaders] == [key(s) for s in full.leaders]
    assert len(full.leaders) == 16 or full.refused
    assert (lean.refused, lean.total, lean.feasible, lean.offload) == (
        full.refused,
        full.total,
        full.feasible,
        full.offload,
    )
    assert lean.smallest is not None and full.smallest is not None
    assert (lean.smallest.plan, lean.smallest.peak_memory) == (full.smallest.plan, full.smallest.peak_memory)
    assert lean.front == [] and full.front
