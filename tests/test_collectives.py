"""simulator.des.flows and simulator.des.topology: ring/hierarchical decomposition, algorithm
choice, volumes, times on the topology, routes, and NIC sharing by concurrent rings."""

from __future__ import annotations

import pytest

from hwprofiles import load_cluster
from hwprofiles.algorithms import Collective, latency_steps
from hwprofiles.schema import Network as NetworkSpec
from simulator.des.engine import Engine, FlowSpec, Phase
from simulator.des.flows import algorithm, bytes_sent_per_rank, collective_phases
from simulator.des.network import Network
from simulator.des.topology import Topology
from simulator.des.transfers import Transfers


@pytest.fixture(scope="module")
def dgx4() -> Topology:
    return Topology(load_cluster("dgx-a100-80gb", 4))


def run_phases(topo: Topology, phases) -> float:
    """Time of a collective alone on the topology (every flow instantiated)."""
    eng = Engine(Network(topo.cap))
    s = eng.add_stream("c")
    ph = [
        Phase(
            tuple(FlowSpec(topo.route(a, b), (1.0,) * len(topo.route(a, b)), n * p.load) for a, b, n in p.flows),
            p.steps * max(topo.latency(topo.route(a, b)) for a, b, _ in p.flows),
        )
        for p in phases
    ]
    x = eng.transfer(s, ph, "dp")
    eng.run()
    return eng.end[x]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_time_in_a_node(dgx4, n):
    S = 1e9
    beta = dgx4.cluster.node.intra_node.bytes_per_s
    lat = dgx4.cluster.node.intra_node.latency_s
    t = run_phases(dgx4, collective_phases(dgx4, Collective.ALL_REDUCE, list(range(n)), S))
    assert t == pytest.approx(2 * (n - 1) / n * S / beta + latency_steps(n, Collective.ALL_REDUCE) * lat, rel=1e-9)


def test_gloo_collectives_are_rings_at_any_size():
    """gloo (the localhost-cpu node) never switches to trees: 4 ranks take 2(n-1) = 6 all-reduce
    steps and n-1 = 3 all-gather steps; NCCL nodes take min(ring, 2*ceil(log2 n)) = 4 and 3."""
    gloo = Topology(without_own_fits(load_cluster("localhost-cpu")))
    assert [p.steps for p in collective_phases(gloo, Collective.ALL_REDUCE, [0, 1, 2, 3], 8.0)] == [6]
    assert [p.steps for p in collective_phases(gloo, Collective.ALL_GATHER, [0, 1, 2, 3], 8.0)] == [3]
    nccl = Topology(load_cluster("dgx-a100-80gb", 1))
    assert [p.steps for p in collective_phases(nccl, Collective.ALL_REDUCE, [0, 1, 2, 3], 8.0)] == [4]


def without_own_fits(cluster):
    """``cluster`` whose node prices every collective with its intra_node link."""
    return cluster.model_copy(update={"node": cluster.node.model_copy(update={"collectives": None})})


def test_own_collective_fits_inside_a_gloo_node():
    """A collective the node fitted on its own (NodeProfile.collectives) runs at its fitted bus
    bandwidth and per-step latency: a 4-rank reduce-scatter of S bytes takes
    (n-1)/n * S / B_rs + (n-1) * a_rs, an all-reduce 2(n-1)/n * S / B_ar + 2(n-1) * a_ar,
    and send/recv S / B_sr + a_sr; broadcast, fitted by none, keeps the link's figures."""
    cluster = load_cluster("localhost-cpu")
    fits = cluster.node.collectives
    assert set(fits) == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    topo = Topology(cluster)
    S, n = 4e6, 4
    rs, ar, sr = fits["reduce_scatter"], fits["all_reduce"], fits["send_recv"]
    t = run_phases(topo, collective_phases(topo, Collective.REDUCE_SCATTER, [0, 1, 2, 3], S))
    assert t == pytest.approx((n - 1) / n * S / rs.bytes_per_s + (n - 1) * rs.latency_s, rel=1e-9)
    t = run_phases(topo, collective_phases(topo, Collective.ALL_REDUCE, [0, 1, 2, 3], S))
    assert t == pytest.approx(2 * (n - 1) / n * S / ar.bytes_per_s + 2 * (n - 1) * ar.latency_s, rel=1e-9)
    t = run_phases(topo, collective_phases(topo, Collective.SEND_RECV, [1, 2], S))
    assert t == pytest.approx(S / sr.bytes_per_s + sr.latency_s, rel=1e-9)
    link = cluster.node.intra_node
    t = run_phases(topo, collective_phases(topo, Collective.BROADCAST, [0, 1, 2, 3], S))
    assert t == pytest.approx(S / link.bytes_per_s + (n - 1) * link.latency_s, rel=1e-9)
    # the bytes a rank sends are the collective's, whatever its speed
    assert bytes_sent_per_rank(collective_phases(topo, Collective.REDUCE_SCATTER, [0, 1, 2, 3], S), 0) == pytest.approx(
        0.75 * S
    )


def test_algorithm_choice(dgx4):
    assert algorithm(dgx4, [0]) == "none"
    assert algorithm(dgx4, [0, 1, 2, 3]) == "ring"  # one node
    assert algorithm(dgx4, [0, 8, 16, 24]) == "ring"  # one member per node
    assert algorithm(dgx4, [0, 1, 8, 9, 16, 17]) == "hierarchical"
    assert algorithm(dgx4, [0, 1, 2, 8]) == "flat"  # irregular


@pytest.mark.parametrize("gpus", [[0, 1, 2, 3], [0, 8, 16, 24], [0, 2, 4, 6, 8, 10, 12, 14], list(range(32))])
def test_volume_per_rank(dgx4, gpus):
    S = 3.0e8
    n = len(gpus)
    ar = collective_phases(dgx4, Collective.ALL_REDUCE, gpus, S)
    rs = collective_phases(dgx4, Collective.REDUCE_SCATTER, gpus, S)
    ag = collective_phases(dgx4, Collective.ALL_GATHER, gpus, S)
    for g in gpus:
        assert bytes_sent_per_rank(ar, g) == pytest.approx(2 * (n - 1) / n * S)
        assert bytes_sent_per_rank(rs, g) == pytest.approx((n - 1) / n * S)
        assert bytes_sent_per_rank(ag, g) == pytest.approx((n - 1) / n * S)


def test_hierarchical_all_reduce_uses_every_nic(dgx4):
    """4 nodes x 8 GPUs: the inter-node phase runs 8 rings on S/8, one per NIC, so it is 8x
    faster than one ring through a single NIC."""
    S = 8e9
    nic = dgx4.cluster.node.nic.bytes_per_s
    t = run_phases(dgx4, collective_phases(dgx4, Collective.ALL_REDUCE, list(range(32)), S))
    intra = 2 * 7 / 8 * S / dgx4.cluster.node.intra_node.bytes_per_s
    inter = 2 * 3 / 4 * (S / 8) / nic
    assert t == pytest.approx(intra + inter, rel=0.01)


def test_broadcast_and_p2p(dgx4):
    S = 1e8
    assert bytes_sent_per_rank(collective_phases(dgx4, Collective.BROADCAST, [0, 8, 16], S), 0) == S
    (ph,) = collective_phases(dgx4, Collective.SEND_RECV, [0, 9], S)
    assert ph.flows == ((0, 9, S),) and ph.steps == 1


def test_routes_are_shortest_paths_and_cached(dgx4):
    for a, b in [(0, 1), (0, 9), (3, 30), (12, 12)]:
        r = dgx4.route(a, b)
        assert dgx4.route(a, b) is r
        if a != b:
            assert len(r) == len(dgx4.nx_route(dgx4.gpu_name(a), dgx4.gpu_name(b)))
            caps = [dgx4.cap[lid] for lid in r]
            assert min(caps) == pytest.approx(
                min(
                    dgx4.cluster.node.intra_node.bytes_per_s if a // 8 == b // 8 else dgx4.cluster.node.nic.bytes_per_s,
                    min(caps),
                )
            )
    assert dgx4.route(5, 5) == ()


@pytest.mark.parametrize("topology", ["fat-tree", "rail-optimized", "single-switch"])
def test_fabrics_connect_every_node(topology):
    c = load_cluster("dgx-a100-80gb", 6).model_copy(update={"network": NetworkSpec(topology=topology, switch_radix=8)})
    topo = Topology(c)
    for a, b in [(0, 47), (7, 40), (3, 19)]:
        r = topo.route(a, b)
        assert len(r) == len(topo.nx_route(topo.gpu_name(a), topo.gpu_name(b)))


def test_oversubscribed_uplink_is_the_bottleneck():
    c = load_cluster("dgx-a100-80gb", 4).model_copy(
        update={"network": NetworkSpec(oversubscription=3.0, switch_radix=16)}
    )
    topo = Topology(c)
    down, up = topo._leaf_ports()
    assert (down, up) == (12, 4)
    r = topo.route(0, 31)
    kinds = [topo.links[lid].kind for lid in r]
    assert "uplink" in kinds and topo.cap[r[kinds.index("uplink")]] == pytest.approx(4 * c.node.nic.bytes_per_s)


def test_eight_rings_leaving_a_node_split_its_nics():
    """pcie-a100-80gb: 8 GPUs share 2 NICs. The 8 data-parallel rings (one per local GPU)
    leaving a node split its NICs 4 ways; the symmetric weighting gives the representative
    ring exactly the rate the full instantiation gets."""
    c = load_cluster("pcie-a100-80gb", 2)
    topo = Topology(c)
    nic = c.node.nic.bytes_per_s
    S = 1e9
    # full: all 8 groups {g, g+8}
    eng = Engine(Network(topo.cap))
    tasks = []
    for g in range(8):
        s = eng.add_stream(f"g{g}")
        (ph,) = collective_phases(topo, Collective.ALL_REDUCE, [g, g + 8], S)
        tasks.append(
            eng.transfer(
                s,
                [
                    Phase(
                        tuple(FlowSpec(topo.route(a, b), (1.0,) * len(topo.route(a, b)), n) for a, b, n in ph.flows),
                        0.0,
                    )
                ],
                "dp",
            )
        )
    eng.run()
    full = max(eng.end[t] for t in tasks)
    assert full == pytest.approx(S / (nic / 4), rel=1e-6)
    # symmetric: one flow of the representative GPU, weighted
    xf = Transfers(topo, p=1, t=8, d=2, full=False, free=False)
    phases, sent = xf.phases(xf.dp_class(0, Collective.ALL_REDUCE), 0, 0, S, count_gpu=0)
    assert sent == pytest.approx(S)
    eng2 = Engine(Network(topo.cap))
    x = eng2.transfer(eng2.add_stream("rep"), [Phase(ph.flows, 0.0) for ph in phases], "dp")
    eng2.run()
    assert eng2.end[x] == pytest.approx(full, rel=1e-9)


def test_nvlink_mesh_routes_over_pair_links():
    from hwprofiles.load import cluster_from_mapping

    node = {
        "name": "mesh",
        "gpu": "v100-sxm2-32gb",
        "gpus_per_node": 4,
        "intra_node": {"kind": "nvlink", "bandwidth_GBps": 50, "latency_us": 2},
        "pcie": {"kind": "pcie", "bandwidth_GBps": 16},
        "nics_per_node": 1,
        "nic": {"kind": "infiniband", "bandwidth_Gbps": 100},
        "host_memory_GiB": 512,
    }
    topo = Topology(cluster_from_mapping({"name": "mesh", "nodes": 2, "node": node}, "mesh"))
    r = topo.route(0, 3)
    assert len(r) == 1 and topo.links[r[0]].name == "n0/gpu0->n0/gpu3"
    assert topo.route(0, 3) != topo.route(1, 3)
    assert len(topo.route(0, 7)) == len(topo.nx_route(topo.gpu_name(0), topo.gpu_name(7)))
