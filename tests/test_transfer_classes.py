"""simulator.des.transfers: transfer classes are named whole by their keys, and the ones built for
a layout are reused by later simulations of that layout on the same topology, which must then
give exactly what a first simulation gives."""

from __future__ import annotations

import pytest

from hwprofiles import load_cluster
from hwprofiles.algorithms import Collective
from simulator.des import simulate_des, transfers
from simulator.des.simulate import topology_for
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan

B = 64
MODEL = "llama2-7b"
# one layout (t=2, d=8 on 4 nodes): data-parallel and hybrid-sharded groups, offload, pipelines
PLANS = [
    "t=2,p=2,d=8,mb=1,zero=3,hsdp=4",
    "t=2,p=2,d=8,mb=1,zero=3",
    "t=2,p=2,d=8,mb=1,zero=1,offload=cpu",
    "t=2,p=2,d=8,mb=2,zero=1,v=4,schedule=interleaved",
    "t=2,p=2,d=8,mb=1,zero=0,schedule=zbv,v=2",
]


def _job(text: str) -> Job:
    model, cluster = load_model(MODEL), load_cluster("dgx-a100-80gb", 4)
    plan, _ = parse_plan(text, model, cluster.num_gpus, B)
    return Job(model, cluster, plan, B)


def _outcome(job: Job, full: bool) -> tuple:
    r = simulate_des(job, full=full)
    rec = r.extra.pop("_des")
    return r.step_time, r.peak_memory, r.time_breakdown, r.memory_breakdown, r.extra, rec.engine.start, rec.engine.end


def _fresh(job: Job, full: bool) -> tuple:
    transfers.forget_built()
    return _outcome(job, full)


@pytest.mark.parametrize("full", [False, True], ids=["symmetric", "full"])
def test_a_layout_simulated_again_gives_what_a_first_simulation_gives(full: bool) -> None:
    jobs = [_job(text) for text in PLANS]
    first = [_fresh(job, full) for job in jobs]
    transfers.forget_built()
    for job, alone in zip(jobs + jobs[::-1], first + first[::-1]):  # each after the others' classes
        assert _outcome(job, full) == alone, job.plan.to_string()
    topo = topology_for(jobs[0].cluster)
    assert list(transfers._BUILT[topo]) == [(2, 8)]  # one layout, built once


def test_classes_of_different_makers_have_different_keys() -> None:
    job = _job(PLANS[0])
    x = transfers.Transfers(topology_for(job.cluster), 2, 2, 8, full=False, free=False)
    keys = [
        x.dp_class(0, Collective.ALL_GATHER).key,
        x.shard_class(0, Collective.ALL_GATHER, 4).key,
        x.shard_class(0, Collective.ALL_GATHER, 2).key,
        x.replica_class(0, 4).key,
        x.p2p_class(0, 1, 0.0).key,
        x.p2p_class(0, 1, 1e-6).key,
        x.p2p_class(1, 0, 0.0).key,
        x.pair_all_reduce_class(0, 1).key,
        x.host_class(0, "d2h").key,
        x.host_class(0, "h2d").key,
    ]
    assert len(set(keys)) == len(keys)


def test_the_last_layouts_are_kept() -> None:
    transfers.forget_built()
    topo = topology_for(load_cluster("dgx-a100-80gb", 4))
    for d in range(1, transfers.LAYOUTS_KEPT + 3):
        transfers.Transfers(topo, 1, 1, d, full=False, free=False)
    transfers.Transfers(topo, 1, 1, 3, full=False, free=False)  # used again: kept, now the newest
    kept = list(transfers._BUILT[topo])
    assert len(kept) == transfers.LAYOUTS_KEPT
    assert kept[-1] == (1, 3) and (1, 1) not in kept and (1, 2) not in kept
