"""The layer partition and recomputation choice (closed forms and CP-SAT)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.partition import levelled_split, optimize_partition
from autoplan.search import SearchOptions
from hwprofiles import load_cluster
from simulator.analytic import estimate
from simulator.job import Job
from simulator.plan import Plan
from simulator.specs import ModelSpec


def heavy_ends_model() -> ModelSpec:
    """A huge vocabulary makes the embedding (first stage) and LM head (last stage) heavy."""
    return ModelSpec(
        name="heavy-ends",
        num_layers=16,
        hidden_size=2048,
        num_attention_heads=16,
        vocab_size=256000,
        seq_length=2048,
        tie_embeddings=False,
    )


def materialized_scores_model() -> ModelSpec:
    """24 layers of h = 4096 keeping their s x s attention scores: ckpt=none overflows one A100's memory."""
    return ModelSpec(
        name="m",
        num_layers=24,
        hidden_size=4096,
        num_attention_heads=32,
        vocab_size=51200,
        seq_length=2048,
        attention="materialized",
    )


def test_partition_beats_or_equals_uniform_on_heavy_ends():
    model = heavy_ends_model()
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    plan = Plan(t=2, p=4, d=1, mb=1, ckpt="full")
    job = Job.make(model, cluster, plan, 32)
    uniform = estimate(job)
    part = optimize_partition(job, choose_recompute=False)
    assert part is not None
    optimized = estimate(Job.make(model, cluster, part.plan, 32))
    assert optimized.step_time <= uniform.step_time * (1 + 1e-9)
    # the LM head (2*b*s*h*V/t FLOPs, ~10 layers' worth at V = 256k) makes the last stage
    # heavy: it gets the fewest transformer layers, fewer than the uniform 4
    layers = part.plan.chunk_layers(model.num_layers)
    assert layers[-1] == min(layers) < 4
    assert optimized.step_time < uniform.step_time * 0.99


def test_recompute_selection_fits_with_less_recompute_than_full():
    model = materialized_scores_model()
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    base = Plan(t=1, p=1, d=8, mb=4, zero=3)
    none = estimate(Job.make(model, cluster, base.replace(ckpt="none"), 64))
    full = estimate(Job.make(model, cluster, base.replace(ckpt="full"), 64))
    assert not none.fits and full.fits
    part = optimize_partition(Job.make(model, cluster, base.replace(ckpt="full"), 64), choose_recompute=True)
    assert part is not None
    chosen = estimate(Job.make(model, cluster, part.plan, 64))
    assert chosen.fits
    assert chosen.time_breakdown["recompute"] < full.time_breakdown["recompute"]
    assert chosen.step_time < full.step_time


def test_no_partition_when_nothing_fits():
    model = ModelSpec(
        name="m", num_layers=8, hidden_size=16384, num_attention_heads=128, vocab_size=51200, seq_length=2048
    )
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    assert optimize_partition(Job(model, cluster, Plan(t=1, p=2, d=1, mb=1, ckpt="full"), 4)) is None


@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_chunks_on_a_device_stay_balanced(v):
    model = heavy_ends_model()
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    plan = Plan(t=2, p=2, d=2, mb=1, ckpt="full", schedule="interleaved", v=v)
    part = optimize_partition(Job.make(model, cluster, plan, 16), choose_recompute=False)
    assert part is not None
    layers = part.plan.chunk_layers(model.num_layers)
    for dev in range(2):
        mine = layers[dev::2]
        assert max(mine) - min(mine) <= 1


def test_levelled_split_evens_the_middle_stages_and_keeps_the_ends():
    # 96 layers on 8 stages, the ends 1 and 2: the middle 93 layers on 6 stages are 15 each and 3
    # spare, on the last three of them (fewer microbatches in flight there)
    plan = Plan(t=1, p=8, d=1, mb=1, layers=(1, 3, 30, 3, 3, 3, 51, 2))
    assert levelled_split(plan).layers == (1, 15, 15, 15, 16, 16, 16, 2)
    assert levelled_split(plan.replace(layers=(1, 15, 15, 15, 16, 16, 16, 2))) is None  # already even
    assert levelled_split(Plan(t=1, p=2, d=1, mb=1, layers=(40, 56))) is None  # no middle stage
    assert levelled_split(Plan(t=1, p=4, d=1, mb=1)) is None  # no split of its own
    mixed = Plan(t=1, p=4, d=1, mb=1, ckpt="full", layers=(1, 3, 1, 3), recompute=((1, 0), (0, 0), (1, 0), (0, 0)))
    assert levelled_split(mixed) is None  # a recomputation map follows its chunks' layers


def test_a_refined_many_stage_plan_is_level_and_as_fast_as_the_solvers():
    """GPT-3 175B's 96 layers on 41 stages: the solver's split held stages of 1 layer among
    stages of 3 (1/3/3/3/3/1/3/...); the finalist keeps a level split with the same step time."""
    from autoplan import finalists
    from autoplan.workers import SHARED, plan_job
    from simulator.model_files import load_model

    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", 41)
    plan = Plan(t=4, p=41, d=2, mb=2, zero=2, sp=1)
    SHARED.update(model=model, clusters={41: cluster}, B=1536, fix={}, opts=SearchOptions(), precs=None, keep=None)
    step = estimate(plan_job(41, plan)).step_time
    _, refined, gain, refined_estimate = finalists._refine((41, plan, step))
    solver = optimize_partition(plan_job(41, plan))
    assert gain is not None and solver is not None
    assert refined_estimate == estimate(plan_job(41, refined))  # what the search's analytic finalists reuse
    middle = refined.layers[1:-1]
    assert max(middle) - min(middle) <= 1
    assert estimate(plan_job(41, refined)).step_time == pytest.approx(
        estimate(plan_job(41, solver.plan)).step_time, rel=1e-9
    )


def test_the_solver_stops_by_its_work_not_the_clock(monkeypatch):
    """A partition stopped by a wall-clock limit depends on how busy the machine is (the gpt-1t
    sweep's 155-node plan came out 353.2 s or 389.8 s): CP-SAT stops at partition.WORK_LIMIT of
    its deterministic work, with one worker, and the wall-clock limit it is given is only a cap."""
    from autoplan import partition
    from autoplan.cpsat import load_cp_model

    sat = load_cp_model()
    seen = []
    solve = sat.CpSolver.solve

    def spy(self, cp, *args, **kwargs):
        seen.append(self.parameters)
        return solve(self, cp, *args, **kwargs)

    monkeypatch.setattr(sat.CpSolver, "solve", spy)
    cluster = load_cluster("dgx-a100-80gb", 1)
    # memory binds here (test_the_full_model_decides_where_the_time_optimum_does_not_fit): the full
    # model, as CP-SAT solves it for a pipeline that interleaves chunks
    job = Job.make(materialized_scores_model(), cluster, Plan(t=1, p=1, d=8, mb=4, zero=3, ckpt="full"), 64)
    assert partition._solve(job, partition.LayerTimes.of(job), partition._device_memory(job), True, 7.0)
    (params,) = seen
    assert params.max_deterministic_time == partition.WORK_LIMIT and params.num_workers == 1
    assert params.max_time_in_seconds == 7.0


def test_the_partition_prices_the_plan_as_its_runtime_runs_it():
    """The split and recomputation are chosen with the job's runtime: autoplan's program on a GPU
    keeps fp32 parameters with Adam, eager layers' activations and bf16 weight copies, so a
    2-stage plan that needs no recomputation under the overlapped default (60 GiB) needs some
    under the program, whose estimate puts the default's choice at 89 GiB of 75: the choice made
    with the program's runtime fits under it."""
    from autoplan.frameworks import load_framework
    from autoplan.frameworks.pricing import plan_runtime
    from simulator.runtime_spec import OVERLAPPED

    model = materialized_scores_model()
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    plan = Plan(t=1, p=2, d=4, mb=2, zero=1, ckpt="full")
    fw = load_framework("autoplan")
    program = plan_runtime(fw, fw.base_runtime(), plan, cluster.node.backend)
    default_choice = optimize_partition(Job(model, cluster, plan, 64, OVERLAPPED))
    program_choice = optimize_partition(Job(model, cluster, plan, 64, program))
    assert default_choice is not None and program_choice is not None
    assert (
        default_choice.plan.ckpt == "none" and not estimate(Job(model, cluster, default_choice.plan, 64, program)).fits
    )
    assert program_choice.plan.ckpt != "none" and estimate(Job(model, cluster, program_choice.plan, 64, program)).fits


SOLVE_THEN_CTRL_C = """
import os, signal, sys, time
from autoplan.partition import optimize_partition
from hwprofiles import load_cluster
from simulator.job import Job
from simulator.plan import Plan
from test_partition import heavy_ends_model
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a search worker does
job = Job.make(heavy_ends_model(), load_cluster("dgx-a100-80gb", 1), Plan(t=2, p=4, d=1, mb=1, ckpt="full"), 32)
assert optimize_partition(job, choose_recompute=False) is not None  # a solve ran
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.2)
print("still here")
"""


def test_a_solve_leaves_the_ctrl_c_handler_as_it_was():
    """CP-SAT's own SIGINT handler resets SIGINT to the default action when a solve ends; a search
    worker that ignores Ctrl-C would then die of one (and could hang the pool it leaves)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parent.parent)])}
    done = subprocess.run(
        [sys.executable, "-c", SOLVE_THEN_CTRL_C], capture_output=True, text=True, timeout=60, env=env
    )
    assert (done.returncode, done.stdout) == (0, "still here\n"), done.stderr[-2000:]


def test_one_layer_per_chunk_is_refined_without_the_solver(monkeypatch):
    """A finalist whose p*v chunks hold one layer each has no other split: the search takes the
    plan without recomputation when it fits, and nothing with the recomputation pinned
    (autoplan.finalists._partitioned), without CP-SAT. The solver, asked, agrees: on the
    heavy-ends model, whose last stage carries ~10 layers' worth of LM head, it finds nothing
    faster than the uniform plan without recomputation."""
    from autoplan import finalists
    from autoplan.workers import SHARED

    model = heavy_ends_model()
    cluster = load_cluster("dgx-a100-80gb", nodes=2)
    plan = Plan(t=1, p=8, d=2, mb=1, v=2, schedule="interleaved", ckpt="selective")
    for key, value in {"model": model, "clusters": {2: cluster}, "B": 32, "opts": SearchOptions()}.items():
        monkeypatch.setitem(SHARED, key, value)
    monkeypatch.setattr(finalists, "optimize_partition", None)  # not called
    assert finalists._partitioned(2, plan, True) == [plan.replace(ckpt="none")]
    assert finalists._partitioned(2, plan, False) == []
    lightest = Job.make(model, cluster, plan.replace(ckpt="none"), 32)
    uniform = estimate(lightest)
    assert uniform.fits
    part = optimize_partition(Job.make(model, cluster, plan, 32))
    assert part is not None
    assert estimate(Job.make(model, cluster, part.plan, 32)).step_time >= uniform.step_time * (1 - 1e-6)


def _solves(monkeypatch):
    """Each CP-SAT solve of autoplan.partition (the full model's: the memory-free one is in closed form)."""
    from autoplan import partition

    calls: list[str] = []
    real = partition._solve

    def solve(job, times, memory, choose_recompute, time_limit_s):
        calls.append("time only" if memory is None else "with memory")
        return real(job, times, memory, choose_recompute, time_limit_s)

    monkeypatch.setattr(partition, "_solve", solve)
    return calls


def test_a_split_optimal_without_the_memory_limit_is_taken_where_it_fits(monkeypatch):
    """The heavy-ends plan fits with room to spare: the split optimal for time alone (in closed
    form) meets the memory rows, so CP-SAT is not called, and its answer is the full model's
    optimum (the rows only remove splits), which CP-SAT finds within its relative gap."""
    from autoplan import partition

    calls = _solves(monkeypatch)
    model, cluster = heavy_ends_model(), load_cluster("dgx-a100-80gb", nodes=1)
    job = Job.make(model, cluster, Plan(t=2, p=4, d=1, mb=1, ckpt="full"), 32)
    part = optimize_partition(job, choose_recompute=False)
    assert part is not None and calls == []
    times, rows = partition.LayerTimes.of(job), partition._device_memory(job)
    full = partition._solve(job, times, rows, False, 2.0)
    assert full is not None and full[4] == "OPTIMAL"
    assert part.objective_s * partition.US <= full[3] * (1 + 1e-9)
    assert part.objective_s * partition.US == pytest.approx(full[3], rel=1e-3)  # CP-SAT's relative gap


def test_the_full_model_decides_where_the_time_optimum_does_not_fit(monkeypatch):
    """Recomputing nothing is fastest, but the materialized scores then overflow the A100: the
    time-only split fails the memory rows, the closed form under memory (autoplan.pipeline_memory,
    one chunk per device) chooses the recomputation without CP-SAT, its answer fits as the
    estimate sees it, and CP-SAT's solve of the full model is no better."""
    from autoplan import partition

    calls = _solves(monkeypatch)
    model, cluster = materialized_scores_model(), load_cluster("dgx-a100-80gb", nodes=1)
    job = Job.make(model, cluster, Plan(t=1, p=1, d=8, mb=4, zero=3, ckpt="full"), 64)
    relaxed = partition._time_optimum(job, partition.LayerTimes.of(job), True)
    assert not any(relaxed[1]) and not any(relaxed[2])  # no recomputation
    assert not partition._fits(partition._device_memory(job), *relaxed[:3])
    part = optimize_partition(job, choose_recompute=True)
    assert calls == []
    assert part is not None and estimate(Job.make(model, cluster, part.plan, 64)).fits
    times, rows = partition.LayerTimes.of(job), partition._device_memory(job)
    full = partition._solve(job, times, rows, True, 10.0)
    assert full is not None and part.objective_s * partition.US <= full[3] * (1 + 1e-9)


def test_the_memory_rows_agree_with_the_linear_memory_model():
    """_fits reads the rows the full model adds; each device's peak from
    DeviceMemoryModel.bytes (its own sum over occupancies and phases) tells the same, away from
    the rounding to thousandths of a MiB: the heavy-ends split (6.8 GiB at its last stage) fits
    an A100, and not a GPU of 7 GiB."""
    from autoplan import partition
    from simulator.cost.schedules import rank_chunks
    from simulator.cost.stage_memory_linear import DeviceMemoryModel

    model = heavy_ends_model()
    for gib, expected in ((80, True), (7, False)):
        cluster = load_cluster("dgx-a100-80gb", nodes=1)
        node = cluster.node.model_copy(update={"gpu": cluster.gpu.model_copy(update={"memory_GiB": gib})})
        cluster = cluster.model_copy(update={"node": node})
        plan = Plan(t=2, p=4, d=1, mb=1, ckpt="none", layers=(3, 5, 5, 3))
        job = Job.make(model, cluster, plan, 32)
        n, rec = plan.chunk_layers(16), plan.chunk_recompute(16)
        f, s = tuple(x for x, _ in rec), tuple(y for _, y in rec)
        peaks = [
            DeviceMemoryModel.of(job, i, 0 in ids, 3 in ids).bytes(
                [n[c] for c in ids], [f[c] for c in ids], [s[c] for c in ids]
            )
            for i, ids in enumerate(rank_chunks(plan.schedule, plan.p, plan.v))
        ]
        assert all(p <= cluster.gpu.usable_memory_bytes for p in peaks) is expected
        assert partition._fits(partition._device_memory(job), n, f, s) is expected
