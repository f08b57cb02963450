"""Measured eager host time, per-op-kind elementwise bandwidth and the last DDP bucket:
the pure formulas against hand-derived numbers."""

from __future__ import annotations

import pydantic
import pytest

from hwprofiles import load_gpu
from hwprofiles.schema import EagerHost
from simulator.analytic.data_parallel import last_bucket_bytes
from simulator.cost.op import Op, elementwise, gemm
from simulator.cost.ops import elementwise_bandwidth, work_time
from simulator.cost.pass_time import pass_times, pass_work

EAGER = EagerHost(
    layer_forward_us=300,
    layer_backward_us=450,
    tp_layer_forward_us=4000,
    tp_layer_backward_us=6000,
    embedding_forward_us=50,
    embedding_backward_us=90,
    head_forward_us=90,
    head_backward_us=140,
    optimizer_tensor_us=40,
)


def cpu_with(**update):
    return load_gpu("cpu").model_copy(update=update)


def test_synchronous_pass_is_work_plus_host_and_asynchronous_is_their_max():
    gpu = cpu_with(eager=EAGER)
    ops = [gemm("fc", 64, 512, 128, 4)]
    work_f = work_time(ops[0], gpu)
    sync = pass_times(ops, gpu, host_us=(300, 450))
    assert sync.forward == pytest.approx(work_f + 300e-6)
    asy = pass_times(ops, gpu, host_async=True, host_us=(300, 450))
    assert asy.forward == pytest.approx(max(work_f, 300e-6))
    # two ranks per slot double everything a CPU rank does, host work included
    assert pass_times(ops, gpu, slowdown=2.0, host_us=(300, 450)).forward == pytest.approx(2 * sync.forward)


def test_a_pass_adds_its_ops_once_and_paces_them_on_every_call():
    """pass_work sums a block's ops; pass_times scales those sums by the pace of the call (the
    slowest GPU's factor, a CPU's shared cores). A GPU stream of a 4096^3 GEMM (two kernels'
    launches at most, far under its work) and a lone 2-element op (launch-bound):
    max(work * factor, kernel_launch_us * kernels)."""
    gpu = load_gpu("a100-sxm4-80gb")
    big, tiny = gemm("fc", 4096, 4096, 4096, 2), elementwise("gelu", 2, 4)
    work = pass_work([big, tiny], gpu)
    assert work.forward == work_time(big, gpu) + work_time(tiny, gpu)
    assert (work.forward_kernels, work.backward_kernels) == (2, 3)  # fc's dgrad and wgrad, gelu's backward
    launch = gpu.kernel_launch_us * 1e-6
    for factor in (1.0, 1.08):
        paced = pass_times([big, tiny], gpu, host_async=True, device_factor=factor)
        assert paced.forward == max(work.forward * factor, 2 * launch)
        assert paced.backward == max(work.backward * factor, 3 * launch)
    alone = pass_times([tiny], gpu, host_async=True, device_factor=1.08)
    assert alone.forward == launch  # launch-bound: the slowest GPU's pace does not show


def test_tensor_parallel_layers_use_the_tp_host_time_when_measured():
    assert EAGER.layer_us(False) == (300, 450)
    assert EAGER.layer_us(True) == (4000, 6000)
    no_tp = EAGER.model_copy(update={"tp_layer_forward_us": None, "tp_layer_backward_us": None})
    assert no_tp.layer_us(True) == (300, 450)


def test_elementwise_ops_run_at_their_kinds_measured_bandwidth():
    gpu = cpu_with(elementwise_GBps={"gelu": 2.0, "layer_norm": 10.0})
    gelu = elementwise("gelu", 1_000_000, 8, 8)  # 8 MB read+written
    assert elementwise_bandwidth(gelu, gpu) == 2.0e9
    assert work_time(gelu, gpu) == pytest.approx(8e6 / 2e9)  # 4 ms
    ln_bwd = Op("ln1_bwd", "elementwise", 0.0, 1e6)
    assert elementwise_bandwidth(ln_bwd, gpu) == 10.0e9
    other = elementwise("dropout_residual1", 1000, 12, 2)
    assert elementwise_bandwidth(other, gpu) == pytest.approx(gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_efficiency)


def test_unknown_elementwise_kind_is_rejected():
    with pytest.raises(pydantic.ValidationError, match="unknown elementwise op kind 'relu'"):
        cpu_with().model_validate({**cpu_with().model_dump(), "elementwise_GBps": {"relu": 3.0}})


@pytest.mark.parametrize(
    "grad_bytes,last",
    [
        (3.6e6, 3.6e6),  # smaller than one 25 MB bucket: the whole reduction waits for the backward
        (25e6, 25e6),
        (60e6, 10e6),  # 25 + 25 + 10
        (75e6, 25e6),  # three full buckets
    ],
)
def test_last_bucket_is_the_remainder_of_whole_buckets(grad_bytes, last):
    assert last_bucket_bytes(grad_bytes) == pytest.approx(last)
