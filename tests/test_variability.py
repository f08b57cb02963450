"""simulator.cost.variability: a synchronous job runs at its slowest GPU's pace."""

from __future__ import annotations

import pytest

from hwprofiles.load import load_cluster
from simulator.cost.stage import compute_slowdown
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


def test_compute_slowdown_carries_the_cluster_size_and_leaves_cpu_ranks_alone():
    small, large = load_cluster("dgx-a100-80gb", 1), load_cluster("dgx-a100-80gb", 128)
    assert small.gpu.speed_spread > 0
    assert compute_slowdown(large) / compute_slowdown(small) == pytest.approx(
        slowest_gpu_factor(1024, small.gpu.speed_spread) / slowest_gpu_factor(8, small.gpu.speed_spread)
    )
    assert load_cluster("localhost-cpu").gpu.speed_spread == 0.0
