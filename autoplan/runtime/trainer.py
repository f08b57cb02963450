"""The training step of one rank: builds its model chunks and applies the whole plan.

Build order per local pipeline chunk: construct on the meta device, tensor-parallelize
(DTensor), materialize on the device, initialize (layout-independent values), then wrap for
data parallelism (FSDP2 / DDP). Then the optimizer (plain, or ZeRO-1's sharded one), the
tied-embedding sync, and the pipeline schedule when p > 1.

One step: forward/backward over the rank's microbatches (pipelined or accumulated), tied
embedding gradient sum, TP partial sums settled, data-parallel reduction when not done by
DDP/FSDP, global grad norm (and clipping), optimizer step. Returns the step's global mean
loss (on ranks that hold the last stage) and the global gradient norm.

Pipelining and tensor parallelism are imported only by plans that use them: they are the
slowest torch modules to import and every worker pays for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from autoplan.runtime.config import RunSpec
from autoplan.runtime.context_parallel import context_shard
from autoplan.runtime.data import local_batch
from autoplan.runtime.data_parallel import HostGradients, ManualGradAllReduce, apply_fsdp, local
from autoplan.runtime.experts import expert_params, expert_shard
from autoplan.runtime.grads import (
    LocalTiedSum,
    TiedEmbeddingSync,
    clip_global_norm,
    replicas,
    settle_partial_grads,
)
from autoplan.runtime.init import init_parameters
from autoplan.runtime.model import GPT, keep_experts, layer_recompute, lm_loss, set_context
from autoplan.runtime.rank import RankLayout, chunk_layer_ids
from autoplan.runtime.support import dp_mode
from autoplan.runtime.zero1 import Zero1Optimizer
from hwprofiles.calibrate.program_optimizer import param_groups, program_adamw
from simulator.cost.rank_view import rank_plan
from simulator.plan import Plan


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    layout: RankLayout

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


@dataclass(frozen=True)
class StepResult:
    loss: float | None
    grad_norm: float


def import_plan_modules(plan: Plan) -> None:
    """Import now the parallel modules ``plan`` uses (imported lazily, module docstring), so
    that their code counts in a rank's RSS baseline and not as training memory (the pipelining
    and tensor-parallel modules add about 30 MiB of RSS)."""
    if plan.p > 1:
        import autoplan.runtime.pipeline
    if plan.t > 1:
        import autoplan.runtime.tensor_parallel  # noqa: F401
    if dp_mode(plan) == "fsdp":
        import torch.distributed.fsdp  # noqa: F401


class Trainer:
    """All model chunks, wrappers, optimizer and schedule of one rank (see module docstring)."""

    def __init__(self, spec: RunSpec, env: DistEnv, optimizer: str, mixed_precision: bool):
        """``optimizer``: ``adamw`` or ``sgd``; ``mixed_precision``: bf16 compute (GPU only)."""
        self.spec, self.env = spec, env
        self.bf16 = mixed_precision and env.cuda
        # the rank's view of a context- or expert-parallel plan: d*cp data-parallel ranks (simulator.cost.rank_view)
        self.plan = plan = rank_plan(spec.plan)
        self.layout = layout = env.layout
        self.mode = dp_mode(plan, spec.plan.ep)
        self.dp_group = env.mesh["dp"].get_group()
        self.context = context_shard(spec.plan, env.rank)
        self.experts = expert_shard(spec.plan, env.rank)
        self.chunks = [self._build_chunk(c) for c in layout.chunks]
        self.loss_fn = self._loss_fn()
        self.params = list(dict.fromkeys(p for m in self.chunks for p in m.parameters()))
        # the experts this rank holds alone among its ep group (expert parallelism; none without)
        self.own_experts = set().union(*(expert_params(m) for m in self.chunks)) if self.experts else set()
        self.ddp: DistributedDataParallel | None = None
        if self.mode == "ddp":
            self.ddp = DistributedDataParallel(
                self.chunks[0], process_group=self.dp_group, device_ids=[env.local_rank] if env.cuda else None
            )
        self.optimizer, self.zero1 = self._build_optimizer(optimizer)
        self.manual_all_reduce = self._manual_all_reduce() if self.mode == "manual" and plan.zero == 0 else None
        self.tied = self._tied_sync()
        self.norm_weights = self._norm_weights()
        self.schedule = None
        if plan.p > 1:
            from autoplan.runtime.pipeline import build_schedule

            self.schedule = build_schedule(
                self.chunks,
                layout,
                plan.schedule,
                spec.num_microbatches,
                self.loss_fn,
                env.device,
                env.mesh["pp"].get_group(),
            )
        # offloaded FSDP2 gradients summed on the host (HostGradients); torch's pipeline stages
        # accumulate FSDP2 gradients unreduced on the GPU instead
        offloaded = self.mode == "fsdp" and plan.offload == "cpu" and env.cuda and plan.p == 1
        self.host_grads = HostGradients(self.params) if offloaded else None
        use_autocast = self.bf16 and self.mode != "fsdp"
        self.amp: Callable[[], contextlib.AbstractContextManager] = (
            (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_autocast else contextlib.nullcontext
        )

    # ------------------------------------------------------------------ construction
    def _build_chunk(self, chunk: int) -> GPT:
        spec, plan, env = self.spec, self.plan, self.env
        model = spec.model
        modes = layer_recompute(model, plan.chunk_layers(model.num_layers), plan.chunk_recompute(model.num_layers))
        with torch.device("meta"):
            m = GPT(model, chunk_layer_ids(model, plan, chunk), chunk == 0, chunk == self.layout.num_chunks - 1, modes)
        if self.context is not None:
            set_context(m, self.context)
        if self.experts is not None:
            keep_experts(m, self.experts)
        if plan.t > 1:
            from autoplan.runtime.tensor_parallel import apply_tensor_parallel

            apply_tensor_parallel(m, env.mesh["tp"], bool(plan.sp))
        m.to_empty(device=env.device)
        m.tie_weights()
        init_parameters(m, spec.train.seed, spec.train.init_std, model.tie_embeddings)
        if self.mode == "fsdp":
            apply_fsdp(
                m,
                env.mesh[("dp_replicate", "dp_shard")] if plan.hsdp else env.mesh["dp"],
                plan.zero,
                offload=plan.offload == "cpu" and env.cuda,
                param_dtype=torch.bfloat16 if self.bf16 else None,
            )
        return m

    def _loss_fn(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The loss of the last chunk's logits: split over the vocabulary with t > 1
        (autoplan.runtime.vocab_parallel), whole otherwise."""
        if self.plan.t == 1:
            return lm_loss
        from autoplan.runtime.vocab_parallel import vocab_parallel_loss

        return vocab_parallel_loss(self.env.mesh["tp"], self.spec.model.vocab_size)

    def _manual_all_reduce(self) -> Callable[[], None]:
        """ZeRO-0's gradient average over the d*cp data-parallel ranks; with expert parallelism
        the experts' over the ranks holding the same experts, summed and divided by d*cp too
        (each already sums its ep group's tokens: autoplan.runtime.experts)."""
        d = self.plan.d
        if self.experts is None:
            return ManualGradAllReduce(self.params, self.dp_group, d)
        own = self.own_experts
        dense = ManualGradAllReduce([p for p in self.params if p not in own], self.dp_group, d)
        assert self.experts.replica_group is not None
        experts = ManualGradAllReduce([p for p in self.params if p in own], self.experts.replica_group, d)

        def both() -> None:
            dense()
            experts()

        return both

    def _build_optimizer(self, kind: str) -> tuple[torch.optim.Optimizer | None, Zero1Optimizer | None]:
        tr = self.spec.train

        def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
            if kind == "sgd":
                return torch.optim.SGD(param_groups(params), lr=tr.check_lr)
            return program_adamw(
                params, lr=tr.lr, betas=tr.betas, eps=tr.eps, weight_decay=tr.weight_decay
            )  # torch's fused AdamW on every device (hwprofiles.calibrate.program_optimizer)

        if self.plan.zero == 1 and self.mode == "manual":
            return None, Zero1Optimizer(self.params, make, self.dp_group)
        return make(self.params), None

    def _tied_sync(self) -> Callable[[], None] | None:
        """The first and last stages' sum of the tied embedding's gradients: across two ranks, or
        under ZB-V on rank 0, which runs both (:class:`LocalTiedSum`); None when p = 1 (one
        module shares the parameter)."""
        if self.plan.p == 1 or not self.spec.model.tie_embeddings:
            return None
        embed, head = self.chunks[0].embed, self.chunks[-1].head
        if self.plan.schedule == "zbv":
            if self.layout.has_first and embed is not None and head is not None:
                return LocalTiedSum(embed.tok.weight, head.out.weight)
            return None
        param = None
        if self.layout.has_first and embed is not None:
            param = embed.tok.weight
        elif self.layout.has_last and head is not None:
            param = head.out.weight
        return TiedEmbeddingSync(self.plan.p, self.plan.d, self.plan.t, self.env.rank, param)

    def _norm_weights(self) -> list[tuple[nn.Parameter, float]]:
        """1/replicas per parameter; the last stage's copy of a tied embedding counts 0."""
        duplicate = None
        head = self.chunks[-1].head
        if self.tied is not None and self.layout.has_last and head is not None and not self.chunks[-1].tied_locally:
            duplicate = head.out.weight
        dp_unique = self.zero1 is not None
        ep = self.experts.size if self.experts is not None else 1
        return [
            (
                p,
                0.0
                if p is duplicate
                else 1.0 / replicas(p, self.plan.t, self.plan.d // (ep if p in self.own_experts else 1), dp_unique),
            )
            for p in self.params
        ]

    # ------------------------------------------------------------------ one step
    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's sequences of the step (its replica's share), and of them its context chunk."""
        m, cp = self.spec.model, self.spec.plan.cp
        x, y = local_batch(
            step,
            self.spec.global_batch,
            m.seq_length,
            m.vocab_size,
            self.spec.train.seed,
            self.layout.dp_rank // cp,
            self.spec.plan.d,
        )
        if self.context is not None:
            x, y = self.context.chunk(x), self.context.chunk(y)
        return x.to(self.env.device), y.to(self.env.device)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        if self.schedule is not None:
            from autoplan.runtime.pipeline import run_schedule

            with self.amp():
                losses = run_schedule(self.schedule, self.layout, x, y)
            return torch.stack([loss.detach().float() for loss in losses]).mean() if losses else None
        model = self.ddp if self.ddp is not None else self.chunks[0]
        m, mb = self.spec.num_microbatches, self.plan.mb
        total = torch.zeros((), device=self.env.device)
        for i in range(m):
            sync_ctx = self.ddp.no_sync() if self.ddp is not None and i < m - 1 else contextlib.nullcontext()
            with sync_ctx:
                with self.amp():
                    loss = self.loss_fn(model(x[i * mb : (i + 1) * mb]), y[i * mb : (i + 1) * mb])
                (loss / m).backward()
            if self.host_grads is not None:
                self.host_grads.take()
            total += loss.detach().float()
        if self.host_grads is not None:
            self.host_grads.give_back()
        return total / m

    def step(self, x: torch.Tensor, y: torch.Tensor, max_norm: float | None) -> StepResult:
        for p in self.params:
            p.grad = None
        loss = self._forward_backward(x, y)
        settle_partial_grads(self.params)  # first: the tied-embedding sum adds local shards of like placements
        if self.tied is not None:
            self.tied()
        if self.manual_all_reduce is not None:
            self.manual_all_reduce()
        if self.zero1 is not None:
            self.zero1.reduce_grads()
            grads = self.zero1.weighted_grads([w for _, w in self.norm_weights])
        else:
            grads = [(local(p.grad), w) for p, w in self.norm_weights if p.grad is not None]
        norm = clip_global_norm(grads, max_norm, self.env.device)
        if self.zero1 is not None:
            self.zero1.step()
        elif self.optimizer is not None:
            self.optimizer.step()
        if loss is not None and self.plan.d > 1:
            dist.all_reduce(loss, group=self.dp_group)
            loss = loss / self.plan.d
        return StepResult(loss=float(loss) if loss is not None else None, grad_norm=norm)
