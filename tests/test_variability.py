"""simulator.cost.variability: a synchronous job runs at its slowest GPU's pace."""

from __future__ import annotations

import pytest

from hwprofiles.load import load_cluster
from simulator.cost.block_times import compute_slowdown, device_slowdown
from simulator.cost.variability import expected_max_normal, slowest_gpu_factor


@pytest.mark.parametrize(
    "n,exact",
    [
        (2, 0.5642),
        (8, 1.4236),
        (100, 2.5076),
        (1000, 3.2414),
    ],  # E[max of n N(0,1)]: 1/sqrt(pi) for n=2; Harter's tables
)
def test_blom_approximates_the_expected_maximum_of_normals(n, exact):
    assert expected_max_normal(n) == pytest.approx(exact, rel=0.05)


def test_one_gpu_waits_for_nobody_and_more_gpus_wait_longer():
    assert expected_max_normal(1) == 0.0 and slowest_gpu_factor(1, 0.011) == 1.0
    assert slowest_gpu_factor(8, 0.0) == 1.0
    # 8 GPUs, spread 1.1%: 1 / (1 - 0.011 * Phi^-1(7.625 / 8.25)) = 1 / (1 - 0.011 * 1.4337)
    assert slowest_gpu_factor(8, 0.011) == pytest.approx(1 / (1 - 0.011 * 1.4337), rel=1e-4)
    factors = [slowest_gpu_factor(n, 0.011) for n in (8, 64, 512, 4096)]
    assert factors == sorted(factors) and factors[-1] < 1.05


def test_device_slowdown_carries_the_cluster_size_and_leaves_cpu_ranks_alone():
    small, large = load_cluster("dgx-a100-80gb", 1), load_cluster("dgx-a100-80gb", 128)
    assert small.gpu.speed_spread > 0
    assert device_slowdown(large) == pytest.approx(slowest_gpu_factor(1024, small.gpu.speed_spread))
    assert device_slowdown(large) > device_slowdown(small) > 1.0
    assert compute_slowdown(large) == compute_slowdown(small) == 1.0  # GPUs share no processor
    cpu = load_cluster("localhost-cpu")
    assert cpu.gpu.speed_spread == 0.0 and device_slowdown(cpu) == 1.0


def test_the_slowest_gpu_slows_kernels_not_the_host_that_issues_them():
    """A launch-bound pass (the host issues kernels slower than the GPU runs them) is not slowed."""
    from simulator.cost.op import Op
    from simulator.cost.ops import work_time
    from simulator.cost.pass_time import stream_time

    gpu = load_cluster("dgx-a100-80gb", 1).gpu
    tiny = work_time(Op("tiny", "elementwise", flops=1.0, bytes=1.0), gpu)
    assert (
        stream_time(tiny, 10, gpu, 1.05)
        == stream_time(tiny, 10, gpu)
        == pytest.approx(10 * gpu.kernel_launch_us * 1e-6)
    )
    big = work_time(Op("big", "elementwise", flops=1e12, bytes=1e9), gpu)
    assert stream_time(big, 1, gpu, 1.05) == pytest.approx(1.05 * stream_time(big, 1, gpu))


def test_busy_multi_gpu_nodes_run_at_their_sustained_clock():
    # dgx-h100: sustained_clock 0.92, speed_spread 0.011. One GPU per node runs at the measured
    # (boost) speed; eight per node at 0.92 of it, on top of the slowest-GPU factor
    one = load_cluster("dgx-h100", 1, 1)
    eight = load_cluster("dgx-h100", 1)
    assert one.gpu.sustained_clock == 0.92 and eight.gpus_per_node == 8
    assert device_slowdown(one) == pytest.approx(slowest_gpu_factor(1, 0.011))
    assert device_slowdown(eight) == pytest.approx(slowest_gpu_factor(8, 0.011) / 0.92)
    assert device_slowdown(load_cluster("dgx-a100-80gb", 1)) == pytest.approx(slowest_gpu_factor(8, 0.011))
