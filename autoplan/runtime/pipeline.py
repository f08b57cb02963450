"""Pipeline parallelism with ``torch.distributed.pipelining``.

Each local chunk becomes a ``PipelineStage`` (shapes inferred at run time); the plan's
schedule maps to ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B`` (v
chunks per rank, looped placement), for zbh1 ``ScheduleInterleavedZeroBubble`` over the rank's
one stage (the backward split into input and weight gradients, the W passes filling the bubble),
or for zbv ``ScheduleZBVZeroBubble`` over its two stages in a V (rank r: stages r and 2p-1-r).
The schedule splits the rank's local batch into the plan's microbatches and averages gradients
over them (``scale_grads``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from autoplan.runtime.rank import RankLayout


def build_schedule(
    modules: Sequence[nn.Module],
    layout: RankLayout,
    schedule: str,
    num_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    group: dist.ProcessGroup,
):
    """One stage per local chunk (in ``layout.chunks`` order) and the plan's schedule over them."""
    stages: list[Any] = [  # the schedules' annotation names torch's private stage base class
        PipelineStage(m, stage_index=c, num_stages=layout.num_chunks, device=device, group=group)
        for m, c in zip(modules, layout.chunks)
    ]
    if schedule == "interleaved":
        return ScheduleInterleaved1F1B(stages, n_microbatches=num_microbatches, loss_fn=loss_fn)
    if schedule == "zbh1":  # one stage per rank: torch's zero-bubble order is ZB-H1 (simulator.cost.schedules)
        return ScheduleInterleavedZeroBubble(stages, n_microbatches=num_microbatches, loss_fn=loss_fn)
    if schedule == "zbv":  # two stages per rank in a V (simulator.cost.schedules.zero_bubble_v)
        return ScheduleZBVZeroBubble(stages, n_microbatches=num_microbatches, loss_fn=loss_fn)
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=num_microbatches, loss_fn=loss_fn)


def run_schedule(schedule, layout: RankLayout, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor] | None:
    """One pipelined forward+backward over the local batch; microbatch losses on the last stage."""
    losses: list[torch.Tensor] | None = [] if layout.has_last else None
    target = y if layout.has_last else None
    if layout.has_first:
        schedule.step(x, target=target, losses=losses, return_outputs=False)
    else:
        schedule.step(target=target, losses=losses, return_outputs=False)
    return losses
