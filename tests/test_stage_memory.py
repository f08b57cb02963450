"""One stage-memory model: the analytic breakdown, its linear form for CP-SAT, and the DES agree."""

from __future__ import annotations

import pytest

from hwprofiles.load import load_cluster
from simulator import Job, load_model, simulate
from simulator.cost.schedules import rank_chunks
from simulator.cost.stage import device_layers, stage_groups
from simulator.cost.stage_memory import stage_memory
from simulator.cost.stage_memory_linear import DeviceMemoryModel
from simulator.plan import Plan

UNEVEN_1F1B = Plan(
    t=8,
    p=8,
    d=2,
    mb=1,
    zero=1,
    ckpt="full",
    schedule="1f1b",
    layers=(11, 12, 12, 12, 12, 12, 12, 13),
    recompute=((11, 0), (6, 6), (0, 12), (3, 0), (12, 0), (0, 0), (5, 7), (13, 0)),
)
CASES = [
    # (model, nodes, global batch, plan): uneven splits and mixed recomputation, every schedule
    ("gpt3-175b", 16, 256, UNEVEN_1F1B),
    (
        "gpt3-175b",
        16,
        256,
        Plan(
            t=8,
            p=4,
            d=4,
            mb=1,
            zero=2,
            ckpt="selective",
            v=2,
            schedule="interleaved",
            layers=(12, 12, 12, 12, 12, 12, 12, 12),
            recompute=((0, 12), (2, 10), (0, 0), (0, 12), (12, 0), (0, 12), (1, 1), (0, 12)),
        ),
    ),
    (
        "llama2-70b",
        8,
        64,
        Plan(
            t=8,
            p=4,
            d=2,
            mb=2,
            zero=3,
            ckpt="selective",
            schedule="gpipe",
            layers=(19, 20, 20, 21),
            recompute=((0, 19), (10, 0), (0, 20), (0, 0)),
        ),
    ),
    ("llama2-7b", 1, 32, Plan(t=2, p=2, d=2, mb=4, zero=0, ckpt="none", schedule="1f1b")),
    # zero bubble: later stages keep the inputs of the weight gradients they still owe
    ("gpt3-175b", 16, 128, UNEVEN_1F1B.replace(schedule="zbh1")),
]


#: the stacks whose runtimes the linear form is checked under (None: the overlapped default)
STACKS = (None, "autoplan", "megatron", "deepspeed", "torchtitan", "llm-foundry")


def _runtime(stack, plan, node):
    """The runtime ``stack`` runs ``plan`` with on ``node`` (autoplan.frameworks.pricing), or the default."""
    from autoplan.frameworks import load_framework
    from autoplan.frameworks.pricing import plan_runtime
    from simulator.runtime_spec import OVERLAPPED

    if stack is None:
        return OVERLAPPED
    fw = load_framework(stack)
    return plan_runtime(fw, fw.base_runtime(), plan, node)


#: without a pipeline, a program's backward holds no weight copy of a fully recomputed layer, and
#: autoplan's program runs DDP (a bucket copy of every gradient) at ZeRO-0
NO_PIPELINE = [
    ("llama2-7b", 1, 32, Plan(t=2, p=1, d=4, mb=2, zero=1, ckpt="full", recompute=((16, 0),))),
    ("llama2-7b", 1, 32, Plan(t=1, p=1, d=8, mb=2, zero=0, ckpt="selective")),
]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("model_name,nodes,batch,plan", [*CASES, *NO_PIPELINE])
def test_linear_form_is_the_stage_memory(model_name, nodes, batch, plan, stack):
    """Evaluated at the plan's split, the partitioner's linear form gives the analytic stage
    memory exactly (the stages' gradients exceed two buckets, where the bucket cap is exact), as
    each stack's runtime holds it: its state bytes, layer kernels' activations, gradient buckets,
    loss and weight copies (the phases of the transient)."""
    model = load_model(model_name)
    cluster = load_cluster("dgx-a100-80gb", nodes)
    runtime = _runtime(stack, plan, cluster.node.backend)
    job = Job.make(model, cluster, plan, batch, runtime=runtime)
    sizes, rec = plan.chunk_layers(model.num_layers), plan.chunk_recompute(model.num_layers)
    costs = {i: c for i, c, _ in stage_groups(model, cluster, plan)}
    chunks = rank_chunks(plan.schedule, plan.p, plan.v)
    for dev, cost in costs.items():
        ids = chunks[dev]
        lin = DeviceMemoryModel.of(job, dev, cost.first, cost.last)
        got = lin.bytes([sizes[c] for c in ids], [rec[c][0] for c in ids], [rec[c][1] for c in ids])
        want = stage_memory(model, cluster, plan, job.m, dev, cost, runtime).total
        assert got == pytest.approx(want, rel=1e-12), f"device {dev}"


def test_linear_form_bounds_small_stages_from_above():
    """Below two gradient buckets the linear form counts the buckets' cap: an upper bound."""
    model, cluster = load_model("tiny"), load_cluster("dgx-a100-80gb", 1)
    plan = Plan(t=1, p=2, d=4, mb=1, zero=0, ckpt="full")
    job = Job.make(model, cluster, plan, 8)
    for dev, cost, _ in stage_groups(model, cluster, plan):
        n = cost.layers
        lin = DeviceMemoryModel.of(job, dev, cost.first, cost.last).bytes([n], [n], [0])
        assert lin > stage_memory(model, cluster, plan, job.m, dev, cost).total


@pytest.mark.parametrize("model_name,nodes,batch,plan", CASES[:2] + CASES[3:])
def test_des_peak_follows_the_stage_memory(model_name, nodes, batch, plan):
    """The DES's memory timeline (same per-layer and state terms, allocated as the passes run)
    peaks within 5% of the analytic stage memory."""
    job = Job.make(load_model(model_name), load_cluster("dgx-a100-80gb", nodes), plan, batch)
    assert simulate(job, "des").peak_memory == pytest.approx(simulate(job, "analytic").peak_memory, rel=0.05)


@pytest.mark.parametrize("layers,p,v", [(96, 8, 6), (7, 3, 2), (80, 6, 1), (24, 5, 4), (128, 16, 8)])
@pytest.mark.parametrize("ckpt", ["none", "selective", "full"])
def test_device_layers_closed_form_sums_the_chunks(layers, p, v, ckpt):
    """The uniform split's per-device sums in closed form equal the per-chunk sums (e.g. 7 layers on
    p=3, v=2: chunks 2/1/1/1/1/1, devices 0, 1, 2 hold chunks 0+3, 1+4, 2+5: 3, 2, 2)."""
    plan = Plan(p=p, v=v, ckpt=ckpt, schedule="interleaved" if v > 1 else "1f1b")
    sizes, rec = plan.chunk_layers(layers), plan.chunk_recompute(layers)
    chunks = rank_chunks(plan.schedule, plan.p, plan.v)
    want = tuple([sum(x[c] for c in cs) for cs in chunks] for x in (sizes, [f for f, _ in rec], [s for _, s in rec]))
    assert device_layers(plan, layers) == want
    if (layers, p, v) == (7, 3, 2):
        assert want[0] == [3, 2, 2]


@pytest.mark.parametrize(
    "plan", ["t=1,p=1,mb=4,ckpt=full", "t=1,p=1,mb=4,ckpt=none", "t=1,p=2,mb=2,ckpt=full", "t=1,p=1,mb=8,ckpt=full"]
)
def test_the_programs_phases_peak_alike_in_the_des_and_the_closed_form(plan):
    """autoplan's program on one H100 (weight copies under autocast, the torch loss's transients;
    mb=8 is one microbatch, whose gradients come after its activations): the DES, which allocates
    the loss's and the forward's transients with the head's passes and those gradients at the
    backward's end, peaks where the closed form's largest phase puts it (phase_memory.phase_transient,
    gradients_late)."""
    from autoplan.runtime.support import program_job
    from simulator.plan import parse_plan

    model, gpus = load_model("llama2-7b"), 2 if "p=2" in plan else 1
    parsed, _ = parse_plan(plan + ",zero=0", model, gpus, 8)
    job = program_job(Job.make(model, load_cluster("dgx-h100", 1, gpus), parsed, 8))
    assert simulate(job, "des").peak_memory == pytest.approx(simulate(job, "analytic").peak_memory, rel=1e-6)
