"""Hybrid sharding (hsdp=N): states sharded over N data-parallel ranks and replicated across
d/N groups, in the plan string, the memory, both simulators, the search and the emitters."""

from __future__ import annotations

import json

import pytest

from autoplan.search import SearchOptions, search
from hwprofiles.load import load_cluster
from simulator import simulate
from simulator.cost import collectives, layout, memory, zero3
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan, parse_plan


def test_plan_string_round_trip_and_groups():
    model = load_model("llama2-7b")
    plan, _ = parse_plan("t=1,p=1,d=64,zero=3,hsdp=8", model, 64, 64)
    assert plan.hsdp == 8 and plan.shard_group == 8 and plan.replicas == 8
    assert plan.to_string().endswith(",hsdp=8") and plan.to_dict()["hsdp"] == 8
    assert Plan(d=64, zero=3).shard_group == 64 and "hsdp" not in Plan(d=64, zero=3).to_dict()


def test_states_are_sharded_over_the_shard_group():
    """ZeRO-3: 16 bytes per parameter / hsdp (not / d)."""
    model = load_model("llama2-7b")
    c = load_cluster("dgx-h100", nodes=8)
    full = simulate(Job.make(model, c, Plan(d=64, zero=3, ckpt="full"), 64), "analytic")
    hybrid = simulate(Job.make(model, c, Plan(d=64, zero=3, ckpt="full", hsdp=8), 64), "analytic")
    psi = full.memory_breakdown["params"] * 64 / 2  # bf16 parameters, sharded 64 ways
    states = memory.model_state_bytes(psi, 8, 3)
    assert hybrid.memory_breakdown["params"] == pytest.approx(states.params)
    assert hybrid.memory_breakdown["optimizer"] == pytest.approx(states.optimizer)
    assert hybrid.memory_breakdown["optimizer"] == pytest.approx(8 * full.memory_breakdown["optimizer"])


def test_shard_links_sit_inside_a_node_and_replicas_across():
    c = load_cluster("dgx-h100", nodes=8)
    links = zero3.shard_links(c, Plan(d=64, zero=3, hsdp=8), "native")
    assert links.n == 8 and links.replicas == 8
    assert links.shard.bandwidth == pytest.approx(collectives.node_link(c).bandwidth)  # NVLink
    across = collectives.group_link(c, layout.group_shape(8, 8, 8))  # one rank per node, 8 groups per node
    assert links.replica is not None and links.replica.bandwidth == pytest.approx(across.bandwidth)
    # each reduced 1/8 shard is then all-reduced across the 8 replicas
    rs = zero3.sharded_reduce_time(8e9, links)
    assert rs == pytest.approx(
        collectives.reduce_scatter_time(8e9, 8, links.shard) + collectives.all_reduce_time(1e9, 8, links.replica)
    )


def test_des_and_analytic_agree_on_a_hybrid_plan():
    model = load_model("llama2-7b")
    job = Job.make(model, load_cluster("dgx-h100", nodes=4), Plan(d=32, mb=2, zero=3, ckpt="full", hsdp=8), 128)
    a, d = simulate(job, "analytic"), simulate(job, "des")
    assert d.step_time == pytest.approx(a.step_time, rel=0.05)
    assert d.peak_memory == pytest.approx(a.peak_memory, rel=0.05)
    counters = d.extra["_des"].counters
    assert counters["dp_bytes"] > 0


def test_search_offers_hybrid_sharding_inside_a_node():
    found = search(
        load_model("llama2-7b"),
        load_cluster("dgx-h100", nodes=4),
        128,
        SearchOptions(fix="t=1,p=1,zero=3,ckpt=full,mb=2", fidelity="analytic", top=4, partition=False),
    )
    assert {r.job.plan.hsdp for r in found.top} == {0, 8}


def test_emitters_write_or_name_the_hybrid_layout():
    from autoplan.emit.deepspeed import export_deepspeed
    from autoplan.emit.megatron import megatron_args
    from autoplan.emit.torchtitan import parallelism
    from autoplan.runtime.config import TrainSettings

    model = load_model("llama2-7b")
    cluster = load_cluster("dgx-h100", nodes=4)
    plan, _ = parse_plan("t=1,p=1,d=32,zero=3,hsdp=8", model, 32, 64)
    job = Job(model, cluster, plan, 64)
    par = parallelism(job, plan)  # torchtitan: FSDP2 on a (replicate 4, shard 8) mesh
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (4, 8)
    args = megatron_args(job, plan, TrainSettings())  # Megatron-FSDP sharded in 32/4 = 8 ranks, 4 instances
    assert args[args.index("--num-distributed-optimizer-instances") + 1] == "4"
    ds = export_deepspeed(job, TrainSettings())  # DeepSpeed 0.19 removed MiCS: the change is named
    assert ds.written is not None and ds.written.hsdp == 0
    assert [c.key for c in ds.changes] == ["hsdp"] and "MiCS" in ds.changes[0].why
    assert "mics_shard_size" not in json.loads(ds.files["ds_config.json"])["zero_optimization"]


@pytest.mark.parametrize("text", ["t=1,p=1,d=16,mb=2,zero=3,ckpt=full,hsdp=4", "t=2,p=2,d=4,mb=2,zero=2,hsdp=2"])
def test_every_rank_simulated_agrees_with_symmetry(text):
    """--full simulates each shard and replicate group on its own; the reduced run weighs one copy."""
    from simulator.des import simulate_des

    model = load_model("llama2-7b")
    plan, _ = parse_plan(text, model, 16, 64)
    job = Job(model, load_cluster("dgx-h100", nodes=2), plan, 64)
    reduced, full = simulate_des(job), simulate_des(job, full=True)
    assert full.step_time == pytest.approx(reduced.step_time, rel=1e-9)
    assert full.peak_memory == pytest.approx(reduced.peak_memory, rel=1e-9)
