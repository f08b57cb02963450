"""Where this rank sits in the (pp, dp, tp) grid and which pipeline chunks it runs.

The rank order is the simulator's (:mod:`simulator.cost.layout`: pp-major, tp-minor, so a
tensor-parallel group is consecutive ranks on one node, as in Megatron-LM); this module only
asks it. With v virtual stages per rank, pipeline rank r runs chunks r, r + p, ..., r + (v-1)p
(looped placement), or under ZB-V chunks r and 2p-1-r (simulator.cost.schedules.global_chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.layout import coords_of, rank_of
from simulator.cost.schedules import global_chunk
from simulator.plan import Plan
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class RankLayout:
    """This rank's coordinates and its share of the model."""

    p: int
    d: int
    t: int
    v: int
    rank: int
    schedule: str = "1f1b"

    @staticmethod
    def of(plan: Plan, rank: int) -> RankLayout:
        return RankLayout(p=plan.p, d=plan.d, t=plan.t, v=plan.v, rank=rank, schedule=plan.schedule)

    @property
    def world(self) -> int:
        return self.p * self.d * self.t

    @property
    def pp_rank(self) -> int:
        return coords_of(self.rank, self.t, self.d)[0]

    @property
    def dp_rank(self) -> int:
        return coords_of(self.rank, self.t, self.d)[1]

    @property
    def tp_rank(self) -> int:
        return coords_of(self.rank, self.t, self.d)[2]

    def global_rank(self, pp: int, dp: int, tp: int) -> int:
        return rank_of(pp, dp, tp, self.t, self.d)

    @property
    def num_chunks(self) -> int:
        return self.p * self.v

    @property
    def chunks(self) -> list[int]:
        """Global pipeline chunk (stage) indices run by this rank, in local chunk order."""
        return [global_chunk(self.schedule, i, self.pp_rank, self.p) for i in range(self.v)]

    @property
    def has_first(self) -> bool:
        return 0 in self.chunks

    @property
    def has_last(self) -> bool:
        return self.num_chunks - 1 in self.chunks


def chunk_layer_ids(model: ModelSpec, plan: Plan, chunk: int) -> range:
    """Global indices of the transformer layers in pipeline chunk ``chunk``."""
    sizes = plan.chunk_layers(model.num_layers)
    start = sum(sizes[:chunk])
    return range(start, start + sizes[chunk])
