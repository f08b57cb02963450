"""FSDP2 under torch.distributed.pipelining: one gradient sync per step (simulator.cost.fsdp2_sync),
its gathers, its step-end reduce-scatters and the memory it holds, in the closed form and the DES."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.runtime.support import program_job
from hwprofiles.load import load_cluster
from simulator import simulate
from simulator.analytic.data_parallel import DpPlan, dp_exposed, dp_links, dp_step_times
from simulator.cost import memory, zero3
from simulator.cost.fsdp2_sync import deferred_sync, plan_deferred_sync
from simulator.cost.stage import stage_groups
from simulator.cost.stage_memory import stage_memory
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan
from simulator.runtime_spec import OVERLAPPED


def _job(text: str, batch: int = 8) -> Job:
    """autoplan's program running ``text`` for the tiny model on a localhost-cpu node of its ranks."""
    model = load_model("tiny")
    ranks = 1
    for kv in text.split(","):
        if kv[0] in "tpd":
            ranks *= int(kv.split("=")[1])
    cluster = load_cluster("localhost-cpu", gpus_per_node=ranks)
    plan, _ = parse_plan(text, model, ranks, batch)
    return program_job(Job.make(model, cluster, plan, batch))


def test_gathers_per_step_as_counted_in_the_program():
    """Per unit and step (benchmarks/data/fsdp2-pipeline-probe-2026-11-29.txt, 3 units per rank):
    ZeRO-3 under a pipeline m + 1 (9 gathers at m = 2, 15 at m = 4), ZeRO-2 1 (3); without a
    pipeline 2m at ZeRO-3 (20 over 5 units at m = 2) and m at ZeRO-2 (10)."""
    assert zero3.gathers_per_step(3, 2, True) == 3 and zero3.gathers_per_step(3, 4, True) == 5
    assert zero3.gathers_per_step(2, 4, True) == 1
    assert zero3.gathers_per_step(3, 2, False) == 4 and zero3.gathers_per_step(2, 2, False) == 2


def test_only_a_pipeline_of_a_torch_pipelining_stack_defers():
    assert plan_deferred_sync(_job("t=1,p=2,d=2,mb=2,zero=3").plan, _job("t=1,p=2,d=2,mb=2,zero=3").runtime)
    for text in ("t=1,p=1,d=2,mb=2,zero=3", "t=1,p=2,d=2,mb=2,zero=1", "t=1,p=2,d=1,mb=2,zero=0"):
        job = _job(text)
        assert not plan_deferred_sync(job.plan, job.runtime), text
    job = _job("t=1,p=2,d=2,mb=2,zero=2")
    assert plan_deferred_sync(job.plan, job.runtime)
    assert not deferred_sync(2, True, OVERLAPPED)  # a runtime without torch.distributed.pipelining


def test_deferred_pass_spreads_the_steps_gathers():
    """m = 4 at ZeRO-3: 5/4 gathering passes per microbatch, no scatter in the passes. A CPU rank:
    5/4 x (30 ms of gathers + a 1 ms copy-out) + 2 ms of hooks = 40.75 ms. A GPU (sigma 0, compute
    longer than the traffic): each gathering pass exposes its first unit's gather, 10 ms:
    5/4 x 10 ms + 5/4 x 1 ms of copy-outs = 13.75 ms."""
    serial = zero3.Zero3Pass(3, 0.030, 0.0, 0.0, 0.001, gathers=5 / 4, host=0.002, serial=True, deferred=True)
    assert serial.exposed(1.0, 2.0, 0.0) == pytest.approx(0.04075)
    gpu = zero3.Zero3Pass(3, 0.030, 0.0, 0.0, 0.001, gathers=5 / 4, deferred=True)
    assert gpu.exposed(1.0, 2.0, 0.0) == pytest.approx(0.01375)


def test_the_step_end_reduces_every_unit_after_the_last_backward():
    """p = 2, d = 2, ZeRO-3: the stage's reduce-scatters (zero3.stage_scatter) after its last
    backward, hidden by none of it: stage 0 exposes them all, the last unit's the last bucket."""
    job = _job("t=1,p=2,d=2,mb=2,zero=3")
    cost = stage_groups(job.model, job.cluster, job.plan, job.runtime.layer_kernels)[0][1]
    links = dp_links(job.cluster, job.plan)
    times = dp_step_times(cost, DpPlan.of(job.plan, job.runtime, job.m), links, 4, job.runtime)
    scatter = zero3.stage_scatter(cost, links, job.runtime, 4)
    assert scatter > 0 and times.after_backward
    assert (times.reduce, times.last_bucket) == pytest.approx(
        (scatter, scatter / zero3.units(cost.layers, True, False))
    )
    assert dp_exposed(times, 1.0, 0.0, True, 0.0) == pytest.approx(scatter)  # a long backward hides none
    every_microbatch = replace(job.runtime, fsdp2_deferred_sync=False)
    assert dp_step_times(cost, DpPlan.of(job.plan, every_microbatch, job.m), links, 4, every_microbatch).reduce == 0.0


@pytest.mark.parametrize("zero", [2, 3])
def test_deferred_stages_hold_every_gradient_and_zero3_every_gathered_unit(zero):
    """Under a pipeline the stage's gradients stay whole through the step (gb = 4 bytes per
    parameter in autoplan's fp32 program) and ZeRO-3's gathered units stay after the backwards
    (PARAM_BYTES each), where without the deferral they are 1/d and two layers."""
    job = _job(f"t=1,p=2,d=2,mb=2,zero={zero}")
    model, cluster, plan = job.model, job.cluster, job.plan
    shape = stage_groups(model, cluster, plan, job.runtime.layer_kernels)[0][1]
    deferred = stage_memory(model, cluster, plan, job.m, 0, shape, job.runtime)
    eager = stage_memory(model, cluster, plan, job.m, 0, shape, replace(job.runtime, fsdp2_deferred_sync=False))
    assert deferred.grads == pytest.approx(4 * shape.params)
    assert eager.grads == pytest.approx(4 * shape.sharded_params / 2)
    gathered = memory.PARAM_BYTES * shape.params - memory.zero3_working_set_bytes(shape.layer_params / shape.layers)
    assert deferred.buffers - eager.buffers == pytest.approx(gathered if zero == 3 else 0.0)


@pytest.mark.parametrize("text", ["t=1,p=2,d=2,mb=2,zero=2", "t=1,p=2,d=2,mb=1,zero=3", "t=1,p=2,d=2,mb=1,zero=3,v=2"])
def test_des_follows_the_closed_form(text):
    """The DES's state machine (simulator.des.program.compute.ChunkShards) gathers, reduces and
    holds as the closed form counts: step time within 10%, peak memory within 6%; and a step
    with the sync deferred is shorter than the same plan reducing every microbatch."""
    if ",v=2" in text:
        text += ",schedule=interleaved"
    job = _job(text)
    des, analytic = simulate(job, "des"), simulate(job, "analytic")
    assert des.step_time == pytest.approx(analytic.step_time, rel=0.10)
    assert des.peak_memory == pytest.approx(analytic.peak_memory, rel=0.06)
    every = replace(job, runtime=replace(job.runtime, fsdp2_deferred_sync=False))
    assert des.step_time < simulate(every, "des").step_time


def test_whole_gradients_stay_on_the_device_in_the_reduce_dtype_offloaded_or_not():
    """torchtitan (bf16 parameters, fp32 reduction) with CPU offload: under a pipeline FSDP2
    accumulates the stage's unsharded gradients on the GPU in fp32, 4 bytes per parameter
    (fsdp2_sync.whole_grad_bytes); without one the offloaded gradients leave none there."""
    from autoplan.frameworks import load_framework
    from autoplan.frameworks.pricing import plan_runtime
    from simulator.plan import Plan

    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 1)
    fw = load_framework("torchtitan")
    for p, per_param in ((2, 4.0), (1, 0.0)):
        plan = Plan(t=1, p=p, d=8 // p, mb=1, zero=2, offload="cpu")
        runtime = plan_runtime(fw, fw.base_runtime(), plan, cluster.node.backend)
        job = Job.make(model, cluster, plan, 16, runtime=runtime)
        shape = stage_groups(model, cluster, plan, runtime.layer_kernels)[0][1]
        grads = stage_memory(model, cluster, plan, job.m, 0, shape, runtime).grads
        assert grads == pytest.approx(per_param * shape.params), p
