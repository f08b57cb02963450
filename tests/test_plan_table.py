"""simulator.plan.table.PlanTable, and the search's candidates as one (autoplan.space.plan_table)."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan import space
from hwprofiles.load import load_cluster
from simulator.analytic.batch import estimate_batch
from simulator.model_files import load_model
from simulator.plan import Plan
from simulator.plan.table import Factor, PlanTable


def _table() -> PlanTable:
    shapes = Factor(("t", "p", "schedule"), [(2, 4, "1f1b"), (4, 2, "zbh1")], np.array([0, 0, 1, 1, 1]))
    options = Factor(("zero", "ckpt"), [(1, "none"), (0, "full")], np.array([0, 1, 0, 1, 1]))
    return PlanTable([shapes, options])


def test_a_row_is_the_plan_of_its_factors_rows() -> None:
    table = _table()
    assert len(table) == 5
    assert table[1] == Plan(t=2, p=4, schedule="1f1b", zero=0, ckpt="full")
    assert table[-1] == Plan(t=4, p=2, schedule="zbh1", zero=0, ckpt="full")
    assert table[2:4] == [Plan(t=4, p=2, schedule="zbh1", zero=1), Plan(t=4, p=2, schedule="zbh1", ckpt="full")]
    assert list(table) == [table[i] for i in range(5)] and table[0] == Plan(t=2, p=4, zero=1)
    with pytest.raises(IndexError):
        table[5]


def test_columns_and_values() -> None:
    table = _table()
    values, index = table.column("p")
    assert [values[j] for j in index] == [4, 4, 2, 2, 2]
    values, index = table.column("ckpt")
    assert [values[j] for j in index] == ["none", "full", "none", "full", "full"]
    assert table.column("d") == ([1], pytest.approx(np.zeros(5)))  # no factor names d: the Plan default
    assert sorted(table.values("schedule")) == ["1f1b", "zbh1"]
    unused = PlanTable([Factor(("t",), [(1,), (2,), (8,)], np.array([2, 0]))])
    assert sorted(unused.values("t")) == [1, 8]  # a row no plan has is not a value


def test_a_taken_table_reads_its_columns_as_a_new_one_would() -> None:
    """take() shares each factor's column codes (read once per factor rows), indexed by its own rows."""
    table = _table()
    table.column("ckpt")  # read before the take: its codes kept for the taken table
    rows = np.array([4, 0, 2])
    taken = table.take(rows)
    fresh = PlanTable([Factor(f.names, f.rows, f.index[rows]) for f in table.factors])
    for name in ("t", "schedule", "zero", "ckpt", "v"):
        values, index = taken.column(name)
        assert [values[j] for j in index.tolist()] == [getattr(table[i], name) for i in rows.tolist()]
        assert values == fresh.column(name)[0] and np.array_equal(index, fresh.column(name)[1])


def test_malformed_tables_are_refused() -> None:
    with pytest.raises(ValueError, match="not plan fields"):
        Factor(("t", "nodes"), [(1, 2)], np.array([0]))
    with pytest.raises(ValueError, match="two factors"):
        PlanTable([Factor(("t",), [(1,)], np.array([0])), Factor(("t",), [(2,)], np.array([0]))])
    with pytest.raises(ValueError, match="different lengths"):
        PlanTable([Factor(("t",), [(1,)], np.array([0])), Factor(("p",), [(2,)], np.array([0, 0]))])


SPACES = [  # model, node profile, nodes, global batch, pins
    ("gpt3-175b", "dgx-a100-80gb", 16, 512, {}),
    ("llama3-8b", "dgx-h100", 4, 256, {}),  # fp8 too, with and without fp8 parameters
    ("mixtral-8x7b", "dgx-h100", 4, 256, {}),  # expert parallelism
    ("llama3-8b", "dgx-h100", 4, 64, {"cp": 2, "fp8ag": 0}),  # context parallelism, fp8ag pinned
    ("llama2-7b", "dgx-a100-80gb", 2, 256, {"hsdp": 0, "zero": 3}),
]


@pytest.mark.parametrize("case", SPACES, ids=lambda c: f"{c[0]}-{c[2]}-{c[4]}")
def test_the_table_lists_every_shape_with_each_of_its_options(case) -> None:
    """The options are listed once per distinct option key of a shape (space._OPTION_KEY): the
    table equals each shape expanded on its own, in order."""
    name, node, nodes, B, fix = case
    model, cluster = load_model(name), load_cluster(node, nodes)
    layouts = list(space.shapes(model, cluster.num_gpus, B, fix))
    precs = space.precisions(cluster.gpu, fix)
    memory = space.memory_options(fix)
    expected = [
        space.plan_of(s, zero, ckpt, off, prec).replace(hsdp=hsdp, fp8ag=fp8ag)
        for s in layouts
        for prec, zero, ckpt, off, hsdp, fp8ag in space.layout_options(
            model, s, memory, fix, cluster.gpus_per_node, precs
        )
    ]
    table = space.plan_table(model, layouts, fix, cluster.gpus_per_node, precs)
    assert len(expected) > 1000
    assert list(table) == expected
    assert space.plans_of(model, layouts, fix, cluster.gpus_per_node, precs) == expected


@pytest.mark.parametrize("case", SPACES[:3], ids=lambda c: f"{c[0]}-{c[2]}")
def test_the_batch_estimate_reads_a_table_as_its_plans(case) -> None:
    name, node, nodes, B, fix = case
    model, cluster = load_model(name), load_cluster(node, nodes)
    layouts = list(space.shapes(model, cluster.num_gpus, B, fix))
    table = space.plan_table(model, layouts, fix, cluster.gpus_per_node, space.precisions(cluster.gpu, fix))
    from_table, from_plans = estimate_batch(model, cluster, table, B), estimate_batch(model, cluster, list(table), B)
    for field in ("step_time", "peak_memory", "fits"):
        assert np.array_equal(getattr(from_table, field), getattr(from_plans, field)), field


def test_tables_that_share_their_option_rows_list_only_their_own_in_the_order_first_seen() -> None:
    """A sweep's sizes number the option rows once for all (space._OPTIONS); each table lists the
    rows its plans have, in the order its plans first have them, whichever size came before."""
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", 8)
    precs = space.precisions(cluster.gpu, {})
    small = list(space.shapes(model, 64, 1536, {}))[::-1]  # another order of keys than the next table's
    large = list(space.shapes(model, 512, 1536, {}))
    space.plan_table(model, small, {}, cluster.gpus_per_node, precs)
    table = space.plan_table(model, large, {}, cluster.gpus_per_node, precs)
    options = next(f for f in table.factors if f.names == space.OPTION_FIELDS)
    first_seen = list(dict.fromkeys(options.rows[i] for i in options.index.tolist()))
    assert list(options.rows) == first_seen
    memory = space.memory_options({})
    expected = [
        space.plan_of(s, zero, ckpt, off, prec).replace(hsdp=hsdp, fp8ag=fp8ag)
        for s in large
        for prec, zero, ckpt, off, hsdp, fp8ag in space.layout_options(model, s, memory, {}, 8, precs)
    ]
    assert list(table) == expected
