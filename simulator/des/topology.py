"""The cluster as a graph of directed links: GPUs, NVSwitch (or NVLink mesh / PCIe fabric),
PCIe switches, host, CPU, NVMe, NICs and the leaf/spine fabric between nodes.

Each directed edge of the networkx ``DiGraph`` carries one *link*: a capacity in bytes/s per
direction and a one-way latency. Link ids index flat lists (``cap``, ``lat``) that the flow
model (:mod:`simulator.des.network`) reads on its hot path.

Layout of one node (``n{k}/...``):

* ``gpu{g}`` -> ``nvswitch`` -> ``gpu{h}``: each GPU's NVSwitch port, ``intra_node`` bandwidth
  per direction (DGX A100/H100, DGX-2). ``intra_node.kind == "nvlink"`` builds a full mesh
  of GPU pairs instead (each pair at ``intra_node`` bandwidth); ``"pcie"`` a PCIe
  peer-to-peer fabric (a star at the profile's peer-to-peer bandwidth).
* ``gpu{g}`` <-> ``pcie{i}``: the GPU's x16 link to its PCIe switch; two GPUs per switch as
  on DGX/HGX baseboards; the switch's x16 uplink to ``host``; the NICs hang off the switches
  (GPUDirect RDMA passes through the GPU's and the NIC's PCIe links, and through the host
  bridge when the GPU's NIC sits on another switch, as with 2 NICs for 8 GPUs).
* ``host`` -> ``cpu``: a pseudo-link whose capacity is the host optimizer throughput
  (``cpu_adam_GBps``), so ranks offloading their optimizer step share the CPU fairly.
* ``host`` <-> ``nvme``: one link (reads and writes share the drives) of
  ``count * bandwidth_GBps``.
* ``nic{i}`` <-> leaf switch, ``nic`` bandwidth.

Between nodes:

* ``fat-tree``: NICs fill leaf switches in order (``down`` ports each); every leaf has one
  aggregated uplink to a non-blocking core (``spine``) of ``up * nic`` bandwidth, where a leaf
  of radix R with oversubscription o has down = floor(R*o/(1+o)) and up = R - down ports
  (Leiserson 1985; the usual two-level folded Clos; a k-level tree with full bisection is
  equivalent at flow level).
* ``rail-optimized``: NIC i of every node goes to rail i's leaf (one leaf per rail per group
  of ``down`` nodes), leaves joined by the same aggregated core (NVIDIA DGX SuperPOD design).
* ``single-switch``: every NIC on one non-blocking switch.

Routes are computed from this structure (the unique shortest path up to the choice among
equivalent NICs/spines) and cached per (source, destination).
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any, NamedTuple

from hwprofiles.schema import ClusterSpec

if TYPE_CHECKING:
    import networkx as nx

GPUS_PER_PCIE_SWITCH = 2  # DGX-1/DGX-2/DGX A100/DGX H100 baseboards: 2 GPUs per PCIe switch


class LinkInfo(NamedTuple):
    """Static description of one directed link (a named tuple: a 1T cluster has 29,000 of them)."""

    name: str
    kind: str  # nvlink, pcie, nic, uplink, downlink, cpu, nvme
    node: int  # node index, or -1 for fabric links between nodes
    capacity: float  # bytes/s per direction
    latency: float  # seconds, one way


class Topology:
    """Graph, link tables and cached routes of one cluster."""

    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        node = cluster.node
        self.nodes = cluster.nodes
        self.gpus_per_node = node.gpus_per_node
        self.nics_per_node = node.nics_per_node
        self._nodes: list[tuple[str, dict[str, Any]]] = []  # the graph's nodes and edges (:attr:`graph`)
        self.links: list[LinkInfo] = []
        self.cap: list[float] = []
        self.lat: list[float] = []
        self._route_cache: dict[tuple[int, int], tuple[int, ...]] = {}
        self._lat_cache: dict[tuple[int, ...], float] = {}
        self.intra_kind = node.intra_node.kind
        self.pcie_switches = max(1, self.gpus_per_node // GPUS_PER_PCIE_SWITCH)

        # per node lookup tables of link ids
        G = self.gpus_per_node
        self._nvl_up: list[list[int]] = []  # [node][gpu] gpu -> switch (star fabrics)
        self._nvl_down: list[list[int]] = []  # [node][gpu] switch -> gpu
        self._mesh: list[dict[tuple[int, int], int]] = []
        self._gpu_sw: list[list[int]] = []  # gpu -> pcie switch
        self._sw_gpu: list[list[int]] = []  # pcie switch -> gpu
        self._sw_host: list[list[int]] = []  # pcie switch -> host
        self._host_sw: list[list[int]] = []
        self._sw_nic: list[list[int]] = []  # pcie switch -> nic
        self._nic_sw: list[list[int]] = []
        self._nic_up: list[list[int]] = []  # nic -> leaf
        self._nic_down: list[list[int]] = []  # leaf -> nic
        self._nic_leaf: list[list[int]] = []  # leaf index of each nic
        self._cpu: list[int] = []
        self._nvme: list[int] = []
        self._leaf_up: list[int] = []
        self._leaf_down: list[int] = []
        self.switch_latency = cluster.network.switch_latency_us * 1e-6
        self._edges: list[tuple[str, str, int]] = []  # (from, to, link id): the graph's edges
        self._build_nodes()
        self._build_fabric()
        assert len(self._nvl_up) == self.nodes and all(len(x) == G for x in self._gpu_sw)

    @functools.cached_property
    def graph(self) -> nx.DiGraph:
        """The cluster as a networkx graph of directed links (named nodes with their kinds; each
        edge's ``link`` id), built on first use: the simulation routes by the lookup tables, the
        graph checks them (:meth:`nx_route`); networkx is imported then too."""
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(self._nodes)
        g.add_edges_from((u, v, {"link": lid}) for u, v, lid in self._edges)
        return g

    # ------------------------------------------------------------------ construction

    def _add_node(self, name: str, **attrs: Any) -> None:
        self._nodes.append((name, attrs))

    def _link(self, u: str, v: str, kind: str, node: int, cap: float, lat: float, lid: int | None = None) -> int:
        if lid is None:
            lid = len(self.links)
            self.links.append(LinkInfo(f"{u}->{v}", kind, node, cap, lat))
            self.cap.append(cap)
            self.lat.append(lat)
        self._edges.append((u, v, lid))
        return lid

    def _build_nodes(self) -> None:
        spec = self.cluster.node
        G = self.gpus_per_node
        intra = spec.intra_node
        pcie = spec.pcie
        nsw = self.pcie_switches
        for k in range(self.nodes):
            pre = f"n{k}/"
            host = pre + "host"
            self._add_node(host, kind="host", node=k)
            for g in range(G):
                self._add_node(pre + f"gpu{g}", kind="gpu", node=k, local=g)
            ups, downs, mesh = [], [], {}
            if self.intra_kind == "nvlink" and G > 1:
                for a in range(G):
                    for b in range(G):
                        if a != b:
                            mesh[(a, b)] = self._link(
                                pre + f"gpu{a}", pre + f"gpu{b}", "nvlink", k, intra.bytes_per_s, intra.latency_s
                            )
            else:
                sw = pre + {"pcie": "p2p", "loopback": "loopback"}.get(self.intra_kind, "nvswitch")
                self._add_node(sw, kind="nvswitch", node=k)
                for g in range(G):
                    ups.append(self._link(pre + f"gpu{g}", sw, self.intra_kind, k, intra.bytes_per_s, intra.latency_s))
                    downs.append(self._link(sw, pre + f"gpu{g}", self.intra_kind, k, intra.bytes_per_s, 0.0))
            self._nvl_up.append(ups)
            self._nvl_down.append(downs)
            self._mesh.append(mesh)
            gsw, swg, swh, hsw = [], [], [], []
            for i in range(nsw):
                self._add_node(pre + f"pcie{i}", kind="pcie-switch", node=k)
                swh.append(self._link(pre + f"pcie{i}", host, "pcie", k, pcie.bytes_per_s, pcie.latency_s))
                hsw.append(self._link(host, pre + f"pcie{i}", "pcie", k, pcie.bytes_per_s, pcie.latency_s))
            for g in range(G):
                i = self._switch_of_gpu(g)
                gsw.append(self._link(pre + f"gpu{g}", pre + f"pcie{i}", "pcie", k, pcie.bytes_per_s, 0.0))
                swg.append(self._link(pre + f"pcie{i}", pre + f"gpu{g}", "pcie", k, pcie.bytes_per_s, 0.0))
            self._gpu_sw.append(gsw)
            self._sw_gpu.append(swg)
            self._sw_host.append(swh)
            self._host_sw.append(hsw)
            self._cpu.append(self._link(host, pre + "cpu", "cpu", k, spec.cpu_adam_GBps * 1e9, 0.0))
            if spec.nvme is not None:
                cap = spec.nvme.count * spec.nvme.bandwidth_GBps * 1e9
                lid = self._link(host, pre + "nvme", "nvme", k, cap, 0.0)
                self._link(pre + "nvme", host, "nvme", k, cap, 0.0, lid=lid)  # one shared link
                self._nvme.append(lid)
            else:
                self._nvme.append(-1)
            swn, nsw_ = [], []
            for i in range(self.nics_per_node):
                s = self._switch_of_nic(i)
                nic = pre + f"nic{i}"
                self._add_node(nic, kind="nic", node=k)
                swn.append(self._link(pre + f"pcie{s}", nic, "pcie", k, pcie.bytes_per_s, 0.0))
                nsw_.append(self._link(nic, pre + f"pcie{s}", "pcie", k, pcie.bytes_per_s, 0.0))
            self._sw_nic.append(swn)
            self._nic_sw.append(nsw_)

    def _leaf_ports(self) -> tuple[int, int]:
        """(down, up) ports of a leaf: down = floor(R*o/(1+o)), up = R - down."""
        net = self.cluster.network
        radix = net.switch_radix
        down = max(1, int(radix * net.oversubscription / (1.0 + net.oversubscription)))
        return down, max(1, radix - down)

    def _build_fabric(self) -> None:
        spec = self.cluster.node
        if self.nics_per_node == 0 or spec.nic is None:
            self._nic_up = [[] for _ in range(self.nodes)]
            self._nic_down = [[] for _ in range(self.nodes)]
            self._nic_leaf = [[] for _ in range(self.nodes)]
            return
        nic = spec.nic
        topo = self.cluster.network.topology
        down, up = self._leaf_ports()
        n_nics = self.nics_per_node
        leaf_of: list[list[int]] = []
        if topo == "single-switch":
            leaf_of = [[0] * n_nics for _ in range(self.nodes)]
            n_leaves = 1
        elif topo == "rail-optimized":
            nodes_per_leaf = down
            groups = -(-self.nodes // nodes_per_leaf)
            leaf_of = [[(k // nodes_per_leaf) * n_nics + i for i in range(n_nics)] for k in range(self.nodes)]
            n_leaves = groups * n_nics
        else:  # fat-tree
            leaf_of = [[(k * n_nics + i) // down for i in range(n_nics)] for k in range(self.nodes)]
            n_leaves = -(-self.nodes * n_nics // down)
        leaf_names = [("switch" if topo == "single-switch" else f"leaf{j}") for j in range(n_leaves)]
        for nm in leaf_names:
            self._add_node(nm, kind="switch")
        self._nic_leaf = leaf_of
        for k in range(self.nodes):
            ups, downs = [], []
            for i in range(n_nics):
                leaf = leaf_names[leaf_of[k][i]]
                ups.append(self._link(f"n{k}/nic{i}", leaf, "nic", k, nic.bytes_per_s, nic.latency_s))
                downs.append(self._link(leaf, f"n{k}/nic{i}", "nic", k, nic.bytes_per_s, 0.0))
            self._nic_up.append(ups)
            self._nic_down.append(downs)
        if n_leaves > 1:
            self._add_node("spine", kind="switch")
            cap = up * nic.bytes_per_s
            for _j, nm in enumerate(leaf_names):
                self._leaf_up.append(self._link(nm, "spine", "uplink", -1, cap, self.switch_latency))
                self._leaf_down.append(self._link("spine", nm, "downlink", -1, cap, self.switch_latency))

    # ------------------------------------------------------------------ queries

    def locate(self, gpu: int) -> tuple[int, int]:
        """(node, local index) of a global GPU id."""
        return divmod(gpu, self.gpus_per_node)

    def gpu_name(self, gpu: int) -> str:
        k, g = self.locate(gpu)
        return f"n{k}/gpu{g}"

    def nic_of(self, local: int) -> int:
        """The NIC a GPU uses across nodes: the one on its own PCIe switch (NCCL's affinity)."""
        return local * self.nics_per_node // self.gpus_per_node

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link ids from GPU ``src`` to GPU ``dst`` (empty when they are the same GPU)."""
        key = (src, dst)
        r = self._route_cache.get(key)
        if r is None:
            r = self._route(src, dst)
            self._route_cache[key] = r
        return r

    def _route(self, src: int, dst: int) -> tuple[int, ...]:
        if src == dst:
            return ()
        ka, ga = self.locate(src)
        kb, gb = self.locate(dst)
        if ka == kb:
            if self._mesh[ka]:
                return (self._mesh[ka][(ga, gb)],)
            return (self._nvl_up[ka][ga], self._nvl_down[kb][gb])
        if self.nics_per_node == 0:
            raise ValueError(f"node profile {self.cluster.node.name} has no NICs but traffic crosses nodes")
        ia, ib = self.nic_of(ga), self.nic_of(gb)
        path = [*self._gpu_to_nic(ka, ga, ia), self._nic_up[ka][ia]]
        la, lb = self._nic_leaf[ka][ia], self._nic_leaf[kb][ib]
        if la != lb:
            path += [self._leaf_up[la], self._leaf_down[lb]]
        path += [self._nic_down[kb][ib], *self._nic_to_gpu(kb, ib, gb)]
        return tuple(path)

    def _switch_of_gpu(self, g: int) -> int:
        return g * self.pcie_switches // self.gpus_per_node

    def _switch_of_nic(self, i: int) -> int:
        return i * self.pcie_switches // self.nics_per_node

    def _gpu_to_nic(self, k: int, g: int, i: int) -> list[int]:
        """GPU -> its PCIe switch -> (the host bridge, when the NIC hangs off another switch) -> NIC."""
        sg, sn = self._switch_of_gpu(g), self._switch_of_nic(i)
        if sg == sn:
            return [self._gpu_sw[k][g], self._sw_nic[k][i]]
        return [self._gpu_sw[k][g], self._sw_host[k][sg], self._host_sw[k][sn], self._sw_nic[k][i]]

    def _nic_to_gpu(self, k: int, i: int, g: int) -> list[int]:
        sg, sn = self._switch_of_gpu(g), self._switch_of_nic(i)
        if sg == sn:
            return [self._nic_sw[k][i], self._sw_gpu[k][g]]
        return [self._nic_sw[k][i], self._sw_host[k][sn], self._host_sw[k][sg], self._sw_gpu[k][g]]

    def to_host(self, gpu: int) -> tuple[int, ...]:
        """GPU -> host memory over PCIe."""
        k, g = self.locate(gpu)
        return (self._gpu_sw[k][g], self._sw_host[k][self._switch_of_gpu(g)])

    def from_host(self, gpu: int) -> tuple[int, ...]:
        k, g = self.locate(gpu)
        return (self._host_sw[k][self._switch_of_gpu(g)], self._sw_gpu[k][g])

    def cpu(self, node: int) -> tuple[int, ...]:
        """The pseudo-link of the host's optimizer throughput."""
        return (self._cpu[node],)

    def nvme(self, node: int) -> tuple[int, ...]:
        lid = self._nvme[node]
        if lid < 0:
            raise ValueError(f"node profile {self.cluster.node.name} has no NVMe but the plan offloads to NVMe")
        return (lid,)

    def latency(self, route: tuple[int, ...]) -> float:
        """One-way latency of a route: the sum of its links' latencies."""
        v = self._lat_cache.get(route)
        if v is None:
            v = sum(self.lat[lid] for lid in route)
            self._lat_cache[route] = v
        return v

    def nx_route(self, src: str, dst: str) -> tuple[int, ...]:
        """Route from networkx's shortest path between two named graph nodes, GPUs being
        endpoints only, never forwarders (for checks of :meth:`route`)."""
        kinds = self.graph.nodes

        def keep(n: str) -> bool:
            return n in (src, dst) or kinds[n].get("kind") != "gpu"

        import networkx as nx

        path = nx.shortest_path(nx.subgraph_view(self.graph, filter_node=keep), src, dst)
        return tuple(self.graph.edges[u, v]["link"] for u, v in itertools.pairwise(path))
