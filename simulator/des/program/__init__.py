"""The task graph of one training iteration of a plan, built on the event engine.

For every simulated rank (symmetric mode: one per pipeline stage, standing for its tensor
group and every data-parallel replica; ``full``: every rank of the cluster) the step is built
part by part, each part in its own module, in this order (task creation order fixes the
engine's tie-breaking, so it is part of the model):

1. :mod:`.memory` -- model states, gradient buckets, pipeline buffers (static memory);
2. :mod:`.compute` -- one task per pass of a microbatch through a pipeline chunk (forward, or
   recompute + backward), split per layer or per gradient bucket where something must happen
   between layers; TP collectives run on the compute stream (Megatron-LM);
3. :mod:`.data_parallel` -- gradient buckets reduced as the backward produces them (all-reduce
   for ZeRO-0, reduce-scatter for ZeRO-1/2 or an all-reduce where the runtime runs it so, or
   once after the last backward without overlap),
   ZeRO-3's per-layer parameter gathers before every pass and gradient reduce-scatters after
   every backward, the offloaded gradient shard's trip to the host;
4. :mod:`.pipeline` -- pipeline sends, one per boundary and microbatch, which the receiver's
   pass (and, blocking, the sender's next pass) waits for;
5. :mod:`.data_parallel` -- the tied embedding's gradient all-reduce between first and last stage;
6. :mod:`.optimizer` -- the step-end scalar all-reduces and the optimizer step (GPU, or the
   offloaded host step with its NVMe traffic);
7. :mod:`.data_parallel` -- ZeRO-1/2's all-gather of the updated parameters;
8. :mod:`.pipeline` -- in the full simulation, the tensor-parallel peers of a pass wait for
   whatever holds that pass back.

Every volume and count comes from :mod:`simulator.cost` (the rules shared with the analytic
estimate: :mod:`simulator.cost.step`).
"""

from __future__ import annotations

from simulator.cost.schedules import device_order
from simulator.des.engine import Engine
from simulator.des.program import compute, data_parallel, memory, optimizer, pipeline
from simulator.des.program.state import DesOptions, Device, Program, TaskInfo
from simulator.des.topology import Topology
from simulator.job import Job

__all__ = ["DesOptions", "Device", "Program", "TaskInfo", "build_program"]


def build_program(job: Job, topo: Topology, engine: Engine, full: bool, options: DesOptions) -> Program:
    """Devices, tasks, transfers and memory changes of one iteration of ``job`` on ``engine``."""
    prog = Program(job, topo, engine, full, options)
    memory.add_static_memory(prog)
    plan = job.plan
    prog.orders = {dev.idx: device_order(plan.schedule, plan.p, job.m, plan.v, dev.pp) for dev in prog.devices}
    for dev in prog.devices:
        compute.add_passes(prog, dev)
    memory.add_late_gradients(prog)
    for dev in prog.devices:
        pipeline.add_sends(prog, dev)
    data_parallel.add_tied_embedding_all_reduce(prog)
    for dev in prog.devices:
        optimizer.add_step(prog, dev)
    data_parallel.add_param_all_gather(prog)
    pipeline.sync_tensor_groups(prog)
    return prog
