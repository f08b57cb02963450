"""FSDP2 under torch.distributed.pipelining: one gradient sync per step (simulator.cost.fsdp2_sync),
its gathers, its step-end reduce-scatters and the memory it holds, in the closed form and the DES."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoplan.runtime.support import program_job
from hwprofiles.load import load_cluster
from simulator import simulate
from simulator.analytic.data_parallel import DpPlan, dp_exposed, dp_links, dp_step_times
from simulator.cost import memory, state_bytes, zero3
from simulator.cost.fsdp2_sync import deferred_sync, plan_deferred_sync
from simulator.cost.ops import dtype_bytes
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
    links = dp_links(job.cluster, job.plan, job.runtime.scatter_gather)
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
    (e bytes each: state_bytes.param_gather_bytes), where without the deferral they are 1/d and two layers."""
    job = _job(f"t=1,p=2,d=2,mb=2,zero={zero}")
    model, cluster, plan = job.model, job.cluster, job.plan
    shape = stage_groups(model, cluster, plan, job.runtime.layer_kernels)[0][1]
    deferred = stage_memory(model, cluster, plan, job.m, 0, shape, job.runtime)
    eager = stage_memory(model, cluster, plan, job.m, 0, shape, replace(job.runtime, fsdp2_deferred_sync=False))
    assert deferred.grads == pytest.approx(4 * shape.params)
    assert eager.grads == pytest.approx(4 * shape.sharded_params / 2)
    e = dtype_bytes(cluster.gpu)
    gathered = state_bytes.param_gather_bytes(e) * shape.params - memory.zero3_working_set_bytes(
        shape.layer_params / shape.layers, e
    )
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


def test_an_offloaded_stage_over_one_rank_is_wrapped_and_holds_its_whole_gradients():
    """autoplan's program offloads ZeRO-3 through FSDP2 even over d = 1 rank (support.dp_mode
    "fsdp"), so under a pipeline its stage accumulates whole fp32 gradients on the GPU (4 bytes
    per parameter) and, with every unit left unsharded by its backwards, the bf16 parameters
    (2 bytes each) too; the closed form and the batch estimate agree, and the same plan at p = 1
    leaves none there."""
    from autoplan.runtime.support import dp_mode
    from simulator.analytic.batch import estimate_batch

    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 1)
    for p, per_param in ((2, 4.0), (1, 0.0)):
        plan, _ = parse_plan(f"t={8 // p},p={p},d=1,mb=1,zero=3,offload=cpu", model, 8, 16)
        assert dp_mode(plan) == "fsdp"
        job = program_job(Job.make(model, cluster, plan, 16))
        shape = stage_groups(model, cluster, plan, job.runtime.layer_kernels)[0][1]
        mem = stage_memory(model, cluster, plan, job.m, 0, shape, job.runtime)
        assert mem.grads == pytest.approx(per_param * shape.params), p
        batch = estimate_batch(model, cluster, [plan], 16, job.runtime)
        assert batch.peak_memory[0] == pytest.approx(simulate(job, "analytic").peak_memory, rel=1e-9), p


def test_fsdp2_zero2_holds_fp32_shards_beside_an_unsharded_compute_copy():
    """autoplan's program runs ZeRO-2 as FSDP2 with reshard_after_forward=False and bf16 mixed
    precision on a GPU: its stage holds the fp32 shards (4/d bytes per parameter) and the bf16
    unsharded parameters (2 bytes), not fp32 parameters whole (4 bytes): at d = 8, 2.5 bytes."""
    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 1)
    plan, _ = parse_plan("t=1,p=1,d=8,mb=1,zero=2", model, 8, 16)
    job = program_job(Job.make(model, cluster, plan, 16))
    shape = stage_groups(model, cluster, plan, job.runtime.layer_kernels)[0][1]
    mem = stage_memory(model, cluster, plan, job.m, 0, shape, job.runtime)
    assert mem.params == pytest.approx((4 / 8 + 2) * shape.params)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 3), (4, 16, 4), (4, 8, 5), (8, 48, 6)])
def test_window_reshards_as_torch_lowers_the_interleaved_schedule(p, m, v):
    """A runtime schedule keeps only its next 3 stages unsharded: the chunks FSDP2's ZeRO-2 gathers
    per step are the UNSHARD actions torch's own lowering inserts into the same order
    (torch.distributed.pipelining.schedules._add_unshard_reshard, torch 2.13), v of them with v <= 3;
    ZeRO-3 without a window's reshards gathers m + 1 times (zero3.gathers_per_step)."""
    from torch.distributed.pipelining.schedules import _Action, _add_unshard_reshard, _ComputationType

    from simulator.cost import schedules
    from simulator.cost.fsdp2_window import rank_gathers

    kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD}
    for s in range(p):
        order = schedules.device_order("interleaved", p, m, v, s)
        lowered = _add_unshard_reshard([_Action(s + op.chunk * p, kinds[op.kind], op.mb) for op in order])
        unshards = sum(a.computation_type == _ComputationType.UNSHARD for a in lowered)
        assert rank_gathers("interleaved", p, m, v, s, 2) == unshards
        if v <= 3:
            assert unshards == v and rank_gathers("interleaved", p, m, v, s, 3) == v * zero3.gathers_per_step(
                3, m, True
            )


@pytest.mark.parametrize("zero", [2, 3])
def test_des_reshards_with_the_window_as_the_closed_form_counts(zero):
    """llama2-7b on one DGX H100, p=2 with v=4 interleaved chunks (the window of 3 reshards): the
    DES (compute.ChunkShards with fsdp2_window.resharded_before) within 5% of the closed form's
    step (fsdp2_window.step_gathers) and 10% of its memory (which holds every gathered ZeRO-3 unit
    at the activations' peak, an upper bound)."""
    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 1)
    plan, _ = parse_plan(f"t=1,p=2,d=4,mb=1,zero={zero},v=4,schedule=interleaved", model, 8, 32)
    job = program_job(Job.make(model, cluster, plan, 32))
    des, analytic = simulate(job, "des"), simulate(job, "analytic")
    assert des.step_time == pytest.approx(analytic.step_time, rel=0.05)
    assert des.peak_memory == pytest.approx(analytic.peak_memory, rel=0.10)


def test_a_pass_releases_its_chunk_when_three_others_run_before_its_next():
    """Hand-derived: in 0 1 2 3 0 the first pass of chunk 0 sees chunks 1, 2, 3 before its next
    (released), and every last pass is released; in 0 1 2 0 only two others come between."""
    from simulator.cost.fsdp2_window import released_after

    assert released_after(np.array([0, 1, 2, 3, 0]), 4).tolist() == [True] * 5
    assert released_after(np.array([0, 1, 2, 0, 3]), 4).tolist() == [False, True, True, True, True]


@pytest.mark.parametrize("zero", [2, 3])
def test_the_closed_form_equals_every_rank_counted_pass_by_pass(zero):
    """step_gathers reads two ranks of a two-rank pipeline (and extrapolates past EXACT_GROUPS
    groups); it equals the mean of every rank's pass-by-pass count (rank_gathers) for p up to 9,
    v from 4 to 8 and up to 7 groups of p microbatches, odd p and the ranks whose lead is exactly
    one block included."""
    from simulator.cost.fsdp2_window import rank_gathers, step_gathers

    for p in range(2, 10):
        for v in range(4, 9):
            for k in range(1, 8):
                m = k * p
                counted = sum(rank_gathers("interleaved", p, m, v, s, zero) for s in range(p)) / (p * v)
                assert step_gathers("interleaved", p, m, v, zero) == pytest.approx(counted), (p, v, k)
