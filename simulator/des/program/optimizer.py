"""The step's end on each rank: scalar all-reduces, then the optimizer step.

Once every gradient of the rank has been reduced: the gradient-norm and loss all-reduces
(:func:`simulator.cost.step.step_sync_time`), then mixed-precision Adam on the GPU
(:func:`simulator.cost.step.optimizer_time`) or, with offload (ZeRO-Offload/Infinity), the
host step in OFFLOAD_SUBGROUPS sub-groups, pipelined: (NVMe read) -> CPU Adam (a link of
``cpu_adam_GBps`` that the node's ranks share) -> (NVMe write), and the updated fp16 shard
back up over PCIe (ZeRO-3: parameters stay on the host).
"""

from __future__ import annotations

from simulator.cost import state_bytes
from simulator.cost.fsdp2_sync import plan_deferred_sync
from simulator.cost.offload import fsdp2_host_seconds
from simulator.cost.step import (
    CPU_ADAM_STATE_BYTES,
    OFFLOAD_SUBGROUPS,
    local_params,
    optimizer_tensors,
    optimizer_time,
    step_sync_time,
)
from simulator.des.program.state import Device, Program, Send, TaskInfo


def add_step(prog: Program, dev: Device) -> None:
    shard = local_params(
        prog.device_params(dev), prog.plan.zero, prog.plan.shard_group, prog.device_sharded_params(dev)
    )
    deps = prog.dp_done[dev.idx] + [prog.pieces_of[dev.idx][-1]]
    sync = 0.0 if prog.opt.free_comm else step_sync_time(prog.job)
    if sync > 0:
        deps = [
            prog.eng.task(prog.stream(dev, "dp"), sync, "dp", deps, TaskInfo(dev.idx, label="norm and loss all-reduce"))
        ]
    if prog.plan.offload == "none":
        dur = optimizer_time(prog.job, shard, optimizer_tensors(prog.job.model, prog.device_layers(dev)))
        prog.opt_last[dev.idx] = prog.eng.task(
            prog.stream(dev, "compute"), dur, "opt", deps, TaskInfo(dev.idx, segments=(("opt", dur),))
        )
        return
    prog.opt_last[dev.idx] = _offloaded_step(prog, dev, shard, deps)


def _offloaded_step(prog: Program, dev: Device, shard: float, deps: list[int]) -> int:
    """The host step's transfers; returns the last one."""
    plan, xfer = prog.plan, prog.xfer
    if prog.job.runtime.offload == "fsdp2":
        return _fsdp2_host_step(prog, dev, shard, deps)
    k = OFFLOAD_SUBGROUPS
    state = shard * prog.costs.optimizer_bytes / k
    nvme = xfer.host_class(dev.pp, "nvme")
    ups: list[int] = []
    for _ in range(k):
        pre = list(deps)
        if plan.offload == "nvme":
            pre.append(prog.transfer(dev, Send("nvme", nvme, "dptp", state, "offload", "optimizer state read"), deps))
        cpu = prog.transfer(
            dev,
            Send(
                "cpu",
                xfer.host_class(dev.pp, "cpu"),
                "dptp",
                shard * CPU_ADAM_STATE_BYTES / k,
                "cpu",
                "CPU Adam",
            ),
            pre,
        )
        if plan.offload == "nvme":
            prog.transfer(dev, Send("nvme_w", nvme, "dptp", state, "offload", "optimizer state write"), (cpu,))
        ups.append(cpu)
        if plan.zero < 3:
            ups[-1] = prog.transfer(
                dev,
                Send(
                    "h2d",
                    xfer.host_class(dev.pp, "h2d"),
                    "dptp",
                    shard * state_bytes.PARAM_BYTES / k,  # the fp16 shard (analytic.offload: up)
                    "offload",
                    "params up",
                    "offload_bytes",
                ),
                (cpu,),
            )
    return ups[-1]


def _fsdp2_host_step(prog: Program, dev: Device, shard: float, deps: list[int]) -> int:
    """FSDP2's host work at the step's end (simulator.cost.offload.fsdp2_host_seconds: the
    microbatches' gradient sums, none with the sync deferred: host_summed_microbatches; the norm,
    AdamW) as one task on the node's CPU link, at the bytes that take it that long when the
    node's ranks share the host."""
    node = prog.job.cluster.node
    deferred = plan_deferred_sync(prog.plan, prog.job.runtime)
    seconds = fsdp2_host_seconds(node, shard, prog.job.m, deferred) / node.gpus_per_node
    send = Send(
        "cpu", prog.xfer.host_class(dev.pp, "cpu"), "dptp", seconds * node.cpu_adam_GBps * 1e9, "cpu", "host step"
    )
    return prog.transfer(dev, send, deps)
