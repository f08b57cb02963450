"""Data-parallel collectives as each runtime runs them (simulator.cost.step): the gradient
collective, the bytes per element the gradients and the gathered parameters move, and autoplan's
program on gloo, whose ZeRO-1 and FSDP2 run every reduce-scatter and all-gather as an all-reduce
(autoplan/runtime/zero1.py, gloo_comms.py; Runtime.scatter_gather), priced so by the analytic
estimate and the DES alike."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoplan.runtime.support import plan_program_runtime, program_job
from hwprofiles import load_cluster
from hwprofiles.algorithms import Collective
from simulator.analytic.data_parallel import DpPlan, dp_links, dp_step_times
from simulator.cost import collectives
from simulator.cost.stage_memory import StageLike
from simulator.cost.state_bytes import grad_reduce_bytes, param_gather_bytes, program_state_bytes, step_gather_bytes
from simulator.cost.step import gradient_all_reduced, gradient_reduction, sharded_op
from simulator.des import simulate_des
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan
from simulator.runtime_spec import OVERLAPPED


@pytest.mark.parametrize(
    "zero, scatter_gather, want",
    [
        (0, "native", Collective.ALL_REDUCE),
        (1, "native", Collective.REDUCE_SCATTER),
        (2, "native", Collective.REDUCE_SCATTER),
        (0, "all-reduce", Collective.ALL_REDUCE),
        (1, "all-reduce", Collective.ALL_REDUCE),
        (2, "all-reduce", Collective.ALL_REDUCE),
    ],
)
def test_the_gradient_collective_of_each_zero_stage(zero, scatter_gather, want):
    assert gradient_reduction(zero, scatter_gather) == want
    column = gradient_all_reduced(np.array([zero, zero]), scatter_gather)
    assert np.broadcast_to(column, (2,)).tolist() == [want == Collective.ALL_REDUCE] * 2


def test_a_sharded_collective_is_itself_or_an_all_reduce():
    for op in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        assert sharded_op(op, "native") == op
        assert sharded_op(op, "all-reduce") == Collective.ALL_REDUCE


def test_bytes_per_element_follow_the_programs_dtypes():
    # Megatron-LM / DeepSpeed on a GPU: bf16 gradients and weights; a fp32 run: 4 bytes
    assert (grad_reduce_bytes(2, "mixed"), step_gather_bytes(2, "mixed")) == (2, 2)
    assert (grad_reduce_bytes(4, "mixed"), step_gather_bytes(4, "mixed")) == (4, 4)
    # autoplan's program keeps fp32 parameters and .grad under bf16 autocast
    assert (grad_reduce_bytes(2, "fp32-params"), step_gather_bytes(2, "fp32-params")) == (4, 4)
    # each pass's gathers move the compute dtype: bf16 on a GPU, fp32 on a CPU
    assert (param_gather_bytes(2), param_gather_bytes(4)) == (2, 4)


def test_the_in_place_zero1_holds_no_gradient_shard_of_its_own():
    # fp32 parameters 4; the flat buffer beside the gradients 4 + 4; the shard's master copy 4,
    # Adam's two moments 8, and the shard's gradient 4 unless it is a view of the buffer
    assert program_state_bytes("fp32-params", 2, 1) == (4, 8, 16)
    assert program_state_bytes("fp32-params", 2, 1, "all-reduce") == (4, 8, 12)
    assert program_state_bytes("mixed", 2, 1, "all-reduce") == (2, 2, 12)


def test_the_program_all_reduces_on_gloo_only():
    plan = Plan(d=4, zero=1)
    assert plan_program_runtime(OVERLAPPED, plan, "gloo").scatter_gather == "all-reduce"
    assert plan_program_runtime(OVERLAPPED, plan, "nccl").scatter_gather == "native"


class _Stage:
    """A stage of ``params`` parameters, all in layers (StageLike's fields dp_step_times reads)."""

    def __init__(self, params: float):
        self.params = params
        self.layer_params = params


def test_zero1_step_times_on_gloo_are_two_all_reduces_of_fp32():
    cluster = load_cluster("localhost-cpu", 1)
    plan = Plan(d=4, zero=1)
    runtime = plan_program_runtime(OVERLAPPED, plan, "gloo")
    links = dp_links(cluster, plan, runtime.scatter_gather)
    stage: StageLike = _Stage(1e6)  # type: ignore[assignment]
    buffer = 1e6 * 4  # fp32 gradients, fp32 parameters
    times = dp_step_times(stage, DpPlan.of(plan, runtime, 4), links, 4, runtime, bucket_bytes=1e9)
    all_reduce = collectives.all_reduce_time(buffer, 4, links.dp)
    assert times.reduce == times.last_bucket == pytest.approx(all_reduce)
    # the gather runs over the shard group's link (ranks computing between its steps)
    assert times.gather == pytest.approx(collectives.all_reduce_time(buffer, 4, links.shards.shard))
    # on NCCL the same program reduce-scatters and all-gathers the same 4-byte buffer
    nccl = replace(runtime, scatter_gather="native")
    native = dp_links(cluster, plan, "native")
    times = dp_step_times(stage, DpPlan.of(plan, nccl, 4), native, 4, nccl, bucket_bytes=1e9)
    assert times.reduce == pytest.approx(collectives.reduce_scatter_time(buffer, 4, native.dp))
    assert times.gather == pytest.approx(collectives.all_gather_time(buffer, 4, native.shards.shard))


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_the_des_moves_twice_the_bytes_when_the_program_all_reduces(zero):
    """Per rank a ring all-reduce moves 2(n-1)/n of the buffer, a reduce-scatter or an
    all-gather (n-1)/n: run as all-reduces, ZeRO-1's and FSDP2's collectives move twice the bytes."""
    cluster = load_cluster("localhost-cpu", 1)
    job = program_job(Job.make(load_model("tiny"), cluster, Plan(d=4, zero=zero, mb=2), 8))
    assert job.runtime.scatter_gather == "all-reduce"
    paired = replace(job, runtime=replace(job.runtime, scatter_gather="native"))
    moved = simulate_des(job).extra["comm_bytes_per_rank"]["dp_bytes"]
    assert moved > 0
    assert moved == pytest.approx(2 * simulate_des(paired).extra["comm_bytes_per_rank"]["dp_bytes"])
