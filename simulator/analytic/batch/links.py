"""The data-parallel collectives of many plans at once (simulator.analytic.data_parallel.
DpCollectives over arrays): each plan's group links' figures, computed once per (t, d, hsdp) by
the one plan's links (data_parallel.dp_links: the groups as simulator.cost.collectives.dp_link and
simulator.cost.zero3.shard_links place them), and the collective times by the one alpha-beta rule
(simulator.cost.collectives.ring_seconds)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hwprofiles.algorithms import Collective
from hwprofiles.schema import ClusterSpec
from simulator.analytic.batch.memo import memo
from simulator.analytic.batch.plans import PlanColumns
from simulator.analytic.data_parallel import dp_links
from simulator.cost.collectives import GroupLink, ring_seconds
from simulator.cost.step import sharded_op
from simulator.numeric import where
from simulator.plan import Plan
from simulator.runtime_spec import ScatterGather

AR, AG, RS = Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER
#: (group, collective) of each figure: ``dp`` all d ranks (ZeRO 0-2's gradient reduction),
#: ``shard`` the shard group (hsdp or d ranks), ``replica`` the replicate group of hybrid sharding
_ROLES = [("dp", AR), ("dp", RS), ("shard", AG), ("shard", RS), ("shard", AR), ("replica", AR)]


def _figures(cluster: ClusterSpec, plan: Plan) -> list[tuple[float, float]]:
    """(bus bytes/s, latency seconds: GroupLink.latency_seconds) of each role's collective; (1, 0) where the
    group has one rank (ring_seconds gives 0 there)."""
    links = dp_links(cluster, plan, "native")  # the groups' figures, whatever op runs on them
    where_: dict[str, tuple[GroupLink | None, int]] = {
        "dp": (links.dp, plan.d),
        "shard": (links.shards.shard, links.shards.n),
        "replica": (links.shards.replica, links.shards.replicas),
    }
    out = []
    for role, op in _ROLES:
        link, n = where_[role]
        if link is None or n <= 1:
            out.append((1.0, 0.0))
            continue
        out.append((link.figures(op)[0], link.latency_seconds(op, n)))
    return out


class BatchLinks:
    """Per plan (as columns beside the stages), the figures of each collective its data-parallel
    traffic uses, and those collectives' times (simulator.analytic.data_parallel.DpCollectives)."""

    def __init__(self, cluster: ClusterSpec, P: PlanColumns, scatter_gather: ScatterGather):
        per, inv = P.per_key(("t", "d", "hsdp"), lambda q, i: _figures(cluster, q), memo((cluster,), "dp link figures"))
        self._table = np.array(per).take(inv, axis=0)[:, :, :, None]  # plans x role x (bandwidth, latency) x 1
        self._index = {key: j for j, key in enumerate(_ROLES)}
        self._scatter_gather = scatter_gather  # the runtime's (simulator.cost.step.sharded_op)
        self._ranks = {"dp": P.d[:, None], "shard": P.shard_group[:, None], "replica": P.replicas[:, None]}

    def _time(self, role: str, op: Collective, size: Any, n: Any | None = None) -> Any:
        fig = self._table[:, self._index[(role, op)]]
        return ring_seconds(op, size, self._ranks[role] if n is None else n, fig[:, 0], fig[:, 1])

    @property
    def n(self) -> np.ndarray:
        return self._ranks["shard"]

    def reduce_gradients(self, all_reduced: Any, size_bytes: Any) -> Any:
        """Each plan's all-reduce (where ``all_reduced``: simulator.cost.step.gradient_all_reduced)
        or reduce-scatter of ``size_bytes`` over its d ranks."""
        return where(all_reduced, self._time("dp", AR, size_bytes), self._time("dp", RS, size_bytes))

    def all_gather(self, size_bytes: Any) -> Any:
        return self._time("shard", sharded_op(AG, self._scatter_gather), size_bytes)

    def reduce_scatter(self, size_bytes: Any) -> Any:
        return self._time("shard", sharded_op(RS, self._scatter_gather), size_bytes)

    def replica_all_reduce(self, size_bytes: Any) -> Any:
        return self._time("replica", AR, size_bytes)
