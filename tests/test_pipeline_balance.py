"""The partition's memory-free optimum in closed form (autoplan.pipeline_balance): hand-derived
splits, and the same objective as CP-SAT's solve of the memory-free model."""

from __future__ import annotations

import pytest
from test_partition import heavy_ends_model

from autoplan import partition
from autoplan.pipeline_balance import balanced_layers, device_extras, least_worst, pipeline_objective
from hwprofiles import load_cluster
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan


def test_a_hand_derived_split():
    """p=4, 16 layers of 10 us, embedding 5 us on device 0, head 25 us on device 3: at T = 49
    the devices take floor((49 - x_i) / 10) = 4, 4, 4, 2 = 14 < 16 layers, at T = 50 they take
    4, 5, 5, 2 = 16; so T* = 50 and the split is (4, 5, 5, 2): times 45, 50, 50, 45."""
    assert device_extras("1f1b", 4, 1, 5, 25) == [5, 0, 0, 25]
    assert least_worst([5, 0, 0, 25], 10, 16, 1) == 50
    assert balanced_layers("1f1b", 4, 1, 16, 10, [5, 0, 0, 25]) == (4, 5, 5, 2)
    # m = 8: (m - 1) * 50 + (45 + 50 + 50 + 45) = 540; interleaved v = 2: 8 * 2 * 50 + 190 - 50
    assert pipeline_objective(50, 190, 8, 1, False) == 540
    assert pipeline_objective(50, 190, 8, 2, True) == 940


def test_the_first_devices_give_back_the_surplus():
    """p=3, 10 layers of 10 us, no embedding or head: T* = 40 lets each device take 4 (12), and
    the 2 layers too many come off device 0 first: (2, 4, 4)."""
    assert balanced_layers("1f1b", 3, 1, 10, 10, device_extras("1f1b", 3, 1, 0, 0)) == (2, 4, 4)


def test_zero_bubble_v_puts_both_ends_on_device_0():
    """ZB-V (p=2, v=2): device 0 holds chunks 0 and 3, device 1 chunks 1 and 2; 8 layers of
    10 us, embedding 5 and head 15 on device 0 (x = 20, 0): T* = 50 (device 0: 3 layers, device
    1: 5), each device's layers spread over its chunks, its later chunk taking the remainder."""
    assert device_extras("zbv", 2, 2, 5, 15) == [20, 0]
    split = balanced_layers("zbv", 2, 2, 8, 10, device_extras("zbv", 2, 2, 5, 15))
    assert split == (1, 2, 3, 2)  # chunk 0 and 3 on device 0 (1 + 2), chunks 1 and 2 on device 1 (2 + 3)


@pytest.mark.parametrize(
    "plan",
    [
        Plan(t=2, p=4, d=1, mb=1),
        Plan(t=2, p=4, d=1, mb=1, ckpt="full"),
        Plan(t=2, p=4, d=1, mb=1, schedule="interleaved", v=2),
        Plan(t=2, p=4, d=1, mb=1, schedule="zbv", v=2),
        Plan(t=1, p=8, d=1, mb=2),
    ],
    ids=str,
)
@pytest.mark.parametrize("choose", [True, False])
def test_the_closed_form_matches_cp_sat_without_memory(plan, choose):
    """CP-SAT's solve of the memory-free model (within its 0.1% relative gap) is never better than
    the closed form's, and the closed form never worse than CP-SAT by more than that gap."""
    job = Job.make(heavy_ends_model(), load_cluster("dgx-a100-80gb", nodes=1), plan, 32)
    times = partition.LayerTimes.of(job)
    closed = partition._time_optimum(job, times, choose)
    solved = partition._solve(job, times, None, choose, 10.0)
    assert solved is not None and solved[4] == "OPTIMAL"
    assert closed[3] <= solved[3] * (1 + 1e-9)
    assert closed[3] == pytest.approx(solved[3], rel=1e-3)
    assert sum(closed[0]) == job.model.num_layers and min(closed[0]) >= 1


def test_the_plans_own_split_is_kept_where_it_is_optimal():
    """gpt3-175b's 96 layers over p=8: the uniform split (12 each) is optimal when the head and
    embedding cost nothing next to a stage, and then it is the answer, unchanged."""
    model = load_model("gpt3-175b")
    job = Job.make(model, load_cluster("dgx-a100-80gb", 8), Plan(t=8, p=8, d=1, mb=1), 64)
    times = partition.LayerTimes.of(job)
    zero_ends = partition.LayerTimes(times.per_layer, times.full_extra, times.sel_extra, 0, 0)
    assert partition._time_optimum(job, zero_ends, True)[0] == (12,) * 8
