"""The one-plan and the many-plan paths of the analytic estimate give identical figures, plan by plan:
simulator.analytic.estimate (numbers) and simulator.analytic.batch.estimate_batch (arrays) call the same
rule functions (simulator.numeric), so a difference is a rule applied on one path only."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from autoplan.space import enumerate_plans, offloads, precisions
from hwprofiles.load import load_cluster
from simulator.analytic import estimate
from simulator.analytic.batch import estimate_batch, estimate_groups
from simulator.analytic.batch.plans import PlanColumns, group_codes
from simulator.analytic.batch.stages import padded_rows, stage_max
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan
from simulator.runtime_spec import DEEPSPEED_ZERO3, NO_DP_OVERLAP, OVERLAPPED, Runtime

FUSED = replace(OVERLAPPED, name="fused", cross_entropy="fused")
PROGRAM = replace(  # program_job's
    NO_DP_OVERLAP,
    name="torch-program",
    cross_entropy="torch",
    weight_copy_bytes=2.0,
    states="fp32-params",
    offload="fsdp2",
)
SPACES = [  # model, node profile, nodes, global batch
    ("gpt3-175b", "dgx-a100-80gb", 128, 1536),
    ("gpt-1t", "dgx-a100-80gb", 384, 3072),
    ("llama2-70b", "dgx-h100", 16, 512),
    ("llama3-8b", "hgx-a100-40gb-roce", 4, 256),
    ("llama2-7b", "pcie-a100-80gb", 2, 64),
    ("gpt3-175b", "dgx2-v100", 32, 512),
    ("tiny", "localhost-cpu", 1, 16),
]
TP_OVERLAP = replace(  # Megatron's profile: TP overlap, buckets growing with d
    OVERLAPPED, name="tp-overlap", layer_kernels="fused-tp-overlap", dp_bucket_bytes=160e6, dp_bucket_bytes_per_rank=4e6
)
CHUNKED = replace(OVERLAPPED, name="chunked", cross_entropy="chunked", zero2="fsdp2")  # torchtitan's profile
PROGRAM_GLOO = replace(PROGRAM, name="torch-program-gloo", scatter_gather="all-reduce")  # its ZeRO-1 on gloo
# a loss that changes with tensor parallelism: the batch prices each plan's (Runtime.loss), t = 1 and t > 1 together
PROGRAM_SPLIT = replace(PROGRAM, name="torch-program-split", tensor_parallel_cross_entropy="split")
AUTOTP = replace(DEEPSPEED_ZERO3, name="autotp", cross_entropy="torch", tensor_parallel_cross_entropy="gathered")
RUNTIMES = [
    OVERLAPPED,
    NO_DP_OVERLAP,
    DEEPSPEED_ZERO3,
    FUSED,
    PROGRAM,
    PROGRAM_GLOO,
    TP_OVERLAP,
    CHUNKED,
    PROGRAM_SPLIT,
    AUTOTP,
]
SAMPLE = 600


def _assert_agree(model, cluster, plans, batch_size, runtime: Runtime) -> None:
    got = estimate_batch(model, cluster, plans, batch_size, runtime)
    cap = cluster.gpu.usable_memory_bytes
    for i, plan in enumerate(plans):
        ref = estimate(Job(model, cluster, plan, batch_size, runtime))
        where = f"{plan.to_string()} ({runtime.name})"
        assert got.peak_memory[i] == ref.peak_memory, where
        assert bool(got.fits[i]) == ref.fits, where
        if ref.peak_memory > cap:
            assert math.isinf(got.step_time[i]), where
        else:
            assert got.step_time[i] == ref.step_time, where


@pytest.mark.parametrize("space", SPACES, ids=lambda s: f"{s[0]}-{s[1]}x{s[2]}")
@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda r: r.name)
def test_batch_equals_scalar_on_random_plans(space, runtime):
    name, node, nodes, batch_size = space
    model, cluster = load_model(name), load_cluster(node, nodes)
    precs = precisions(cluster.gpu, {})  # fp8 too on the H100 nodes
    targets = offloads(cluster.node, {})  # nvme only on nodes with NVMe drives
    plans = enumerate_plans(model, cluster.num_gpus, batch_size, {}, cluster.gpus_per_node, precs, targets)
    rng = random.Random(f"{name}{node}{runtime.name}")
    sample = rng.sample(plans, min(SAMPLE, len(plans)))
    assert len({p.zero for p in sample}) == 4 and len({p.offload for p in sample}) >= 2  # the sample is mixed
    assert {p.prec for p in sample} == set(precs)
    sample += [p.replace(fp8ag=0) for p in sample if p.fp8ag][:100]  # fp8 plans without fp8 parameters too
    _assert_agree(model, cluster, sample, batch_size, runtime)


@pytest.mark.parametrize(
    "text",
    [
        "t=8,p=4,zero=2,layers=20/28/28/20,recompute=4:0/2:2/0:0/0:4",
        "t=8,p=8,mb=1,zero=1,recompute=3:0/3:0/3:0/3:0/6:0/6:0/6:0/6:0",
        "t=4,p=4,mb=1,zero=1,v=2,schedule=interleaved,layers=10/14/12/12/12/12/14/10",
        "t=8,p=2,mb=1,zero=3,offload=nvme,ckpt=full",
        "t=8,p=1,zero=3,hsdp=4,offload=none,ckpt=selective",
    ],
)
def test_batch_equals_scalar_on_explicit_splits(text):
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", 16)
    plan, _ = parse_plan(text, model, cluster.num_gpus, 256)
    for runtime in RUNTIMES:
        _assert_agree(model, cluster, [plan], 256, runtime)


def test_empty_batch():
    model, cluster = load_model("tiny"), load_cluster("localhost-cpu", 1)
    assert estimate_batch(model, cluster, [], 16).step_time.shape == (0,)


@pytest.mark.parametrize("bound", [1, 7, 300, 50_000, 10**9])  # sparse values in the table; past it, np.unique's sort
def test_grouping_equals_numpy_unique(bound):
    rng = random.Random(bound)
    key = np.array([rng.randrange(bound) for _ in range(5000)], dtype=np.int64)
    first, inverse = group_codes(key, bound)
    _, want_first, want_inverse = np.unique(key, return_index=True, return_inverse=True)
    assert np.array_equal(first, want_first) and np.array_equal(inverse, want_inverse.reshape(-1))
    empty_first, empty_inverse = group_codes(np.zeros(0, dtype=np.int64), 0)
    assert len(empty_first) == len(empty_inverse) == 0


@pytest.mark.parametrize("width", [1, 2, 4, 9])
def test_stage_max_is_numpys_row_max(width):
    rng = np.random.default_rng(width)
    values = np.where(rng.random((300, width)) < 0.3, -np.inf, rng.normal(size=(300, width)))
    assert np.array_equal(stage_max(values), values.max(axis=1))


@pytest.mark.parametrize("case", [SPACES[0], SPACES[2]], ids=lambda c: f"{c[0]}-{c[2]}")
def test_runtime_groups_estimated_together_equal_each_group_alone(case) -> None:
    """estimate_groups (the plans' stages made once for every group) gives each plan what
    estimate_batch of its group alone gives, whatever the groups and their order."""
    from autoplan import space

    name, node, nodes, B = case
    model, cluster = load_model(name), load_cluster(node, nodes)
    layouts = list(space.shapes(model, cluster.num_gpus, B, {}))
    table = space.plan_table(model, layouts, {}, cluster.gpus_per_node, space.precisions(cluster.gpu, {}))
    group = np.random.default_rng(7).integers(0, 3, len(table))
    groups = [(rt, np.flatnonzero(group == k)) for k, rt in enumerate((PROGRAM, OVERLAPPED, CHUNKED))]
    together = estimate_groups(model, cluster, table, B, groups[::-1])
    for runtime, rows in groups:
        alone = estimate_batch(model, cluster, table.take(rows), B, runtime)
        for field in ("step_time", "peak_memory", "fits"):
            assert np.array_equal(getattr(together, field)[rows], getattr(alone, field)), (runtime.name, field)


def test_padded_rows_stack_arrays_of_different_lengths() -> None:
    got = padded_rows([np.array([[1.0, 2.0]]), np.array([[3.0, 4.0], [5.0, 6.0]]), np.array([[7.0, 8.0]])], 3)
    want = [[[1, 2], [0, 0], [0, 0]], [[3, 4], [5, 6], [0, 0]], [[7, 8], [0, 0], [0, 0]]]
    assert got.shape == (3, 3, 2) and got.tolist() == want


def test_values_read_from_the_columns_are_the_plans_fields() -> None:
    """per_row_key (a value reading PlanColumns.value_of, no Plan made) groups and answers as
    per_key does with the plans themselves."""
    from autoplan import space

    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", 16)
    layouts = list(space.shapes(model, cluster.num_gpus, 256, {}))
    table = space.plan_table(model, layouts, {}, cluster.gpus_per_node, space.precisions(cluster.gpu, {}))
    P = PlanColumns(table, 256).take(np.arange(len(table))[::-3])
    names = ("schedule", "p", "ckpt", "zero")
    by_rows = P.per_row_key(names, lambda i: tuple(P.value_of(n, i) for n in names))
    by_plans = P.per_key(names, lambda q, i: tuple(getattr(q, n) for n in names))
    assert by_rows[0] == by_plans[0] and np.array_equal(by_rows[1], by_plans[1])
    assert len(by_rows[0]) > 10
    got = [by_rows[0][k] for k in by_rows[1].tolist()]
    assert got == [tuple(getattr(P.plans[i], n) for n in names) for i in range(len(P.plans))]


def test_one_model_on_clusters_of_two_dtypes_equals_scalar():
    """The batch estimate's memos shared by a model object (simulator.analytic.batch.memo) keep
    apart what differs with the cluster's dtype: ZeRO-3's gathered working set at e bytes."""
    model = load_model("tiny")
    bf16, fp32 = load_cluster("dgx-a100-80gb", 1), load_cluster("localhost-cpu", 1)
    for cluster in (bf16, fp32):
        n = cluster.num_gpus
        plans = [parse_plan(text, model, n, 16)[0] for text in (f"d={n},zero=3", f"d={n // 2},p=2,zero=3")]
        _assert_agree(model, cluster, plans, 16, DEEPSPEED_ZERO3)


@pytest.mark.parametrize(
    "runtime", [PROGRAM_GLOO, replace(PROGRAM_GLOO, name="split", tensor_parallel_cross_entropy="split")]
)
def test_cpu_node_with_its_waits_equals_scalar(runtime):
    """A CPU node with the sync wait and the bus wait (NodeProfile.sync_wait_us, sync_bus_us_per_MB):
    the batch prices every collective's links as the scalar estimate does, on every plan of 4 ranks."""
    from conftest import localhost_cpu

    model, cluster = load_model("tiny"), localhost_cpu(4, sync_wait_us={2: 300.0}, sync_bus_us_per_MB={2: 800.0})
    plans = enumerate_plans(model, cluster.num_gpus, 16, {}, cluster.gpus_per_node, ("fp32",), ("none",))
    assert len({(p.t, p.p, p.d, p.zero) for p in plans}) > 10
    _assert_agree(model, cluster, plans, 16, runtime)
    waitless = estimate_batch(model, localhost_cpu(4, sync_wait_us=None), plans, 16, runtime).step_time
    assert (estimate_batch(model, cluster, plans, 16, runtime).step_time > waitless).sum() > len(plans) // 2
