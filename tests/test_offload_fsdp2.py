"""FSDP2's CPU offload as autoplan's program runs it: the rules of simulator.cost.offload against
hand-derived figures, the analytic model and the DES agreeing on it, and the program's host sum
of the microbatches' gradients (autoplan.runtime.data_parallel.HostGradients)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoplan.runtime.data_parallel import HostGradients
from autoplan.runtime.support import program_job
from hwprofiles.load import load_cluster
from simulator import simulate
from simulator.cost.offload import (
    fsdp2_host_seconds,
    fsdp2_transfer_seconds,
    fsdp2_transfers,
    host_summed_microbatches,
)
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan


def _node(**figures: float):
    node = load_cluster("dgx-h100", 1, 8).node
    return node.model_copy(update=figures)


def test_transfer_seconds_by_hand():
    # PCIe 64 GB/s at efficiency 0.8 = 51.2 GB/s; 1.48e9 parameters on d=1: up twice and down
    # once at 4 bytes: 3 * 4 * 1.48e9 / 51.2e9 = 0.346875 s; on d=4 a quarter of that
    node = _node()
    assert node.pcie.bytes_per_s == pytest.approx(51.2e9)
    assert fsdp2_transfer_seconds(node, 1.48e9, 1) == pytest.approx(0.346875)
    assert fsdp2_transfer_seconds(node, 1.48e9, 4) == pytest.approx(0.346875 / 4)


def test_host_seconds_by_hand():
    # 8 ranks share the host; 1e9 parameters each, 8 microbatches, sums at 40 GB/s, norm at
    # 10 GB/s, AdamW at 50 GB/s of 12-byte state:
    # 8 * 1e9 * (4 * 7 / 40e9 + 4 / 10e9 + 12 / 50e9) = 8 * (0.7 + 0.4 + 0.24) = 10.72 s
    node = _node(host_sum_GBps=40.0, host_norm_GBps=10.0, cpu_adam_GBps=50.0)
    assert node.gpus_per_node == 8
    assert fsdp2_host_seconds(node, 1e9, 8) == pytest.approx(10.72)
    assert fsdp2_host_seconds(node, 1e9, 1) == pytest.approx(8 * (0.4 + 0.24))  # one microbatch: no sum


def test_a_deferred_sync_moves_the_gradients_down_once_a_step():
    """Under torch.distributed.pipelining FSDP2's gradients accumulate on the GPU: with m = 16
    microbatches at ZeRO-3 (17 gathers a step) a microbatch moves (17 + 1) / 16 = 1.125 shards,
    not 3, and the host sums nothing; without the deferral 3 shards and 16 microbatches apart."""
    assert fsdp2_transfers(16, True, 17.0) == pytest.approx(1.125)
    assert fsdp2_transfers(16, False, 0.0) == 3.0
    assert fsdp2_transfers(16, False, 0.0, 2) == 2.0  # ZeRO-2: the backward uses the forward's gather
    assert host_summed_microbatches(16, True) == 1
    assert host_summed_microbatches(16, False) == 16
    node = _node()
    assert fsdp2_transfer_seconds(node, 1.48e9, 1, 1.125) == pytest.approx(0.346875 * 1.125 / 3)


def test_offloaded_pipeline_priced_without_host_sums():
    """llama2-7b, t=4, p=2, d=1 offloaded at ZeRO-3 on a DGX H100, 16 microbatches: the program
    wraps the stage in FSDP2 and torch's pipeline defers its sync, so the host step is the norm
    and AdamW alone; the same plan with the sync every microbatch also sums 15 microbatches'
    gradients, in the ratio fsdp2_host_seconds gives for one parameter."""
    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 1)
    plan, _ = parse_plan("t=4,p=2,d=1,mb=1,zero=3,offload=cpu", model, 8, 16)
    job = program_job(Job.make(model, cluster, plan, 16))
    eager = dataclasses.replace(job, runtime=dataclasses.replace(job.runtime, fsdp2_deferred_sync=False))
    deferred_s = simulate(job, "analytic").time_breakdown["offload"]
    every_s = simulate(eager, "analytic").time_breakdown["offload"]
    ratio = fsdp2_host_seconds(cluster.node, 1.0, 16) / fsdp2_host_seconds(cluster.node, 1.0, 1)
    assert every_s / deferred_s == pytest.approx(ratio, rel=1e-6)


def _offload_job() -> Job:
    model = load_model("benchmarks/models/llama7b-slice.yaml")
    cluster = load_cluster("hgx-h200", 1, 1)
    plan, _ = parse_plan("t=1,p=1,d=1,mb=1,zero=3,ckpt=none,offload=cpu", model, 1, 8)
    return program_job(Job.make(model, cluster, plan, 8))


def test_program_offloads_as_fsdp2_and_both_simulators_agree():
    job = _offload_job()
    assert job.runtime.offload == "fsdp2"
    analytic = simulate(job, "analytic")
    des = simulate(job, "des")
    assert des.step_time == pytest.approx(analytic.step_time, rel=0.02)
    deepspeed = simulate(
        dataclasses.replace(job, runtime=dataclasses.replace(job.runtime, offload="deepspeed")), "analytic"
    )
    # FSDP2 moves fp32 shards each microbatch and sums on the host: slower than DeepSpeed's pricing
    assert analytic.step_time > 2 * deepspeed.step_time


def test_host_gradients_sum_the_microbatches():
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3)
    params = list(layer.parameters())
    x = torch.randn(6, 5)
    for part in (x[:2], x[2:4], x[4:]):
        layer(part).square().sum().backward()
    expected = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    held = HostGradients(params)
    for part in (x[:2], x[2:4], x[4:]):
        layer(part).square().sum().backward()
        held.take()
        assert all(p.grad is None for p in params)  # the next microbatch's copy finds no gradient
    held.give_back()
    for p, want in zip(params, expected):
        torch.testing.assert_close(p.grad, want)
    assert held.held == {}
