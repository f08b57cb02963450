"""A mixture-of-experts MLP in autoplan's program, and its expert parallelism.

:class:`MoEMLP`: a router (h x E, no bias) scores every token; each token goes to its k
best-scoring experts, weighted by the softmax of those k scores (Mixtral's routing, Jiang et al.
2024); each expert is the model's MLP; the weighted outputs are summed per token.

Expert parallelism (:class:`ExpertShard`): the ep ranks of a group (consecutive data-parallel
coordinates, as Megatron-LM orders them: simulator.cost.rank_view) each keep E/ep experts. A rank
sorts its routed rows by expert, sends each rank the rows of its experts with an all-to-all
(``torch.distributed.nn.functional.all_to_all_single``, differentiable; gloo runs it), runs its
experts on what it receives, and sends the outputs back the same way (the dispatch and combine
of Megatron-core's alltoall token dispatcher). An expert's gradient then sums the tokens of the
whole ep group; averaged over the d*cp/ep ranks holding the same expert and divided by ep, it is
the gradient of the global mean loss (:func:`expert_params`, used by the trainer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn.functional as F
from torch import nn

from simulator.cost.layout import rank_of
from simulator.plan import Plan
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class ExpertShard:
    """This rank's experts: shard ``index`` of ``size``, tokens exchanged over ``group``; its
    experts' gradients are summed over ``replica_group`` (the ranks holding the same experts)."""

    size: int
    index: int
    group: dist.ProcessGroup | None = None
    replica_group: dist.ProcessGroup | None = None


def expert_shard(plan: Plan, rank: int) -> ExpertShard | None:
    """This rank's shard, making the process groups of every ep group and expert-replica group
    (a collective: every rank calls it, in the same order). The program's grid is the rank view
    (t, p, g = d*cp); ep group r of a (pp, tp) position holds coordinates r*ep .. r*ep + ep - 1."""
    if plan.ep == 1:
        return None
    t, g, ep = plan.t, plan.grad_group, plan.ep
    index, group, replicas = -1, None, None
    for pp in range(plan.p):
        for tp in range(t):
            for r in range(g // ep):
                ranks = [rank_of(pp, r * ep + j, tp, t, g) for j in range(ep)]
                made = dist.new_group(ranks)
                if rank in ranks:
                    index, group = ranks.index(rank), made
            for j in range(ep):
                ranks = [rank_of(pp, r * ep + j, tp, t, g) for r in range(g // ep)]
                made = dist.new_group(ranks)
                if rank in ranks:
                    replicas = made
    return ExpertShard(ep, index, group, replicas)


class MoEMLP(nn.Module):
    """Router and E experts (module docstring); :meth:`keep_shard` drops the experts other ranks hold."""

    def __init__(self, spec: ModelSpec, make_expert: Callable[[ModelSpec], nn.Module]):
        super().__init__()
        assert spec.num_experts is not None
        self.num_experts, self.top_k = spec.num_experts, spec.moe_router_topk
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=False)
        self.experts = nn.ModuleDict({str(i): make_expert(spec) for i in range(spec.num_experts)})
        self.shard: ExpertShard | None = None

    def keep_shard(self, shard: ExpertShard) -> None:
        """Keep only this rank's E/ep experts (their names, and so their initial values, unchanged)."""
        local = self.num_experts // shard.size
        mine = {str(i) for i in range(shard.index * local, (shard.index + 1) * local)}
        for name in [n for n in self.experts if n not in mine]:
            del self.experts[name]
        self.shard = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        top, chosen = self.router(flat).topk(self.top_k, dim=-1)
        weight = F.softmax(top.float(), dim=-1).to(x.dtype).reshape(-1)
        expert = chosen.reshape(-1)
        order = torch.argsort(expert, stable=True)  # the routed rows grouped by expert
        token = torch.arange(flat.shape[0], device=x.device).repeat_interleave(self.top_k)[order]
        rows, expert = flat[token], expert[order]
        out_rows = self._experts(rows, expert) if self.shard is None else self._exchange(rows, expert)
        y = torch.zeros_like(flat).index_add(0, token, out_rows * weight[order].unsqueeze(-1))
        return y.reshape(b, s, h)

    def _experts(self, rows: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """Each row through its expert (all held here)."""
        out = torch.zeros_like(rows)
        for name, mlp in self.experts.items():
            idx = (expert == int(name)).nonzero(as_tuple=True)[0]
            out = out.index_add(0, idx, mlp(rows[idx]))
        return out

    def _exchange(self, rows: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """Dispatch the rows to the ranks of their experts, run this rank's experts, combine."""
        shard = self.shard
        assert shard is not None
        local = self.num_experts // shard.size
        send = torch.bincount(expert // local, minlength=shard.size)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=shard.group)
        send_splits, recv_splits = send.tolist(), recv.tolist()
        their_expert = torch.empty(sum(recv_splits), dtype=expert.dtype, device=expert.device)
        dist.all_to_all_single(their_expert, expert, recv_splits, send_splits, group=shard.group)
        received = dist_fn.all_to_all_single(
            rows.new_empty(sum(recv_splits), rows.shape[1]), rows, recv_splits, send_splits, group=shard.group
        )
        done = self._experts(received, their_expert)
        return dist_fn.all_to_all_single(rows.new_empty(rows.shape), done, send_splits, recv_splits, group=shard.group)


def expert_params(model: nn.Module) -> set[nn.Parameter]:
    """The parameters of the experts a rank holds (reduced over the expert-replica group)."""
    return {p for m in model.modules() if isinstance(m, MoEMLP) for p in m.experts.parameters()}
