"""The planner: brute-force agreement, pins, no-fit, pruning safety (analytic vs DES)."""

import dataclasses
import json
import subprocess
import sys

import pytest
from scipy.stats import spearmanr

from autoplan import space
from autoplan.search import NoPlanFits, SearchOptions, search
from hwprofiles.load import cluster_from_mapping, load_cluster
from simulator import simulate
from simulator.analytic import estimate
from simulator.job import Job
from simulator.plan import parse_plan
from simulator.specs import ModelSpec


def small_cluster(nodes: int = 1, gpus_per_node: int = 4, gpu: str = "a100-sxm4-40gb"):
    return cluster_from_mapping(
        {
            "name": f"small-{nodes}x{gpus_per_node}",
            "nodes": nodes,
            "node": {
                "name": "small-node",
                "gpu": gpu,
                "gpus_per_node": gpus_per_node,
                "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 300, "latency_us": 3},
                "pcie": {"kind": "pcie", "bandwidth_GBps": 25, "latency_us": 2},
                "nics_per_node": gpus_per_node,
                "nic": {"kind": "infiniband", "bandwidth_Gbps": 200, "latency_us": 5},
                "host_memory_GiB": 512,
            },
        },
        "test",
    )


SMALL = ModelSpec(
    name="small", num_layers=8, hidden_size=2048, num_attention_heads=16, vocab_size=32000, seq_length=1024
)
MEDIUM = ModelSpec(
    name="medium", num_layers=16, hidden_size=5120, num_attention_heads=40, vocab_size=51200, seq_length=2048
)
LARGE = ModelSpec(
    name="large", num_layers=32, hidden_size=8192, num_attention_heads=64, vocab_size=51200, seq_length=2048
)


def all_feasible(model, cluster, B, fix=None, fidelity="des"):
    out = []
    for plan in space.enumerate_plans(model, cluster.num_gpus, B, fix or {}, cluster.gpus_per_node):
        job = Job(model, cluster, plan, B)
        a = estimate(job)
        if not a.fits:
            continue
        out.append((plan, a, simulate(job, fidelity) if fidelity == "des" else a))
    return out


def test_planner_matches_brute_force_des():
    cluster = small_cluster(nodes=2, gpus_per_node=2)
    fix = {"offload": "none"}
    rows = all_feasible(SMALL, cluster, 16, fix)
    des_best = min(r[2].step_time for r in rows if r[2].fits)
    found = search(SMALL, cluster, 16, SearchOptions(fix="offload=none", top=8, fidelity="des"))
    assert found.best_result.step_time <= des_best * 1.01


@pytest.mark.parametrize(
    "model,cluster_args,B,fix",
    [
        (SMALL, (1, 4), 16, "offload=none,zero=0"),
        (MEDIUM, (2, 4), 32, "offload=none,zero=1"),
        (LARGE, (2, 8), 32, "offload=none,zero=1,ckpt=full"),
    ],
)
def test_pruning_is_safe(model, cluster_args, B, fix):
    """The analytic estimate ranks plans like the DES (Spearman >= 0.9) and the DES-best plan
    is inside the analytic top K."""
    cluster = small_cluster(*cluster_args)
    rows = all_feasible(model, cluster, B, space.parse_fix(fix))
    assert len(rows) >= 10
    rho = spearmanr([r[1].step_time for r in rows], [r[2].step_time for r in rows]).statistic
    assert rho >= 0.9, rho
    by_analytic = sorted(rows, key=lambda r: r[1].step_time)
    des_best = min(rows, key=lambda r: r[2].step_time)[0]
    assert des_best in [r[0] for r in by_analytic[:8]]


def test_fix_is_honoured():
    found = search(MEDIUM, small_cluster(2, 4), 32, SearchOptions(fix="t=2,zero=1,ckpt=full", fidelity="analytic"))
    for r in [found.best_result, *found.top]:
        assert r.job.plan.t == 2 and r.job.plan.zero == 1 and r.job.plan.ckpt == "full"


def test_no_plan_fits_raises_with_smallest_memory():
    huge = ModelSpec(
        name="huge", num_layers=96, hidden_size=12288, num_attention_heads=96, vocab_size=51200, seq_length=2048
    )
    with pytest.raises(NoPlanFits, match=r"smallest needs [0-9.]+ GiB"):
        search(huge, small_cluster(1, 2), 8, SearchOptions(fix="offload=none", fidelity="analytic"))


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "autoplan", *args], capture_output=True, text=True, timeout=300)


def test_cli_infeasible_fix_exit_2():
    r = run_cli(
        "plan",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-80gb",
        "--nodes",
        "2",
        "--global-batch",
        "64",
        "--fix",
        "t=7",
    )
    assert r.returncode == 2
    assert r.stderr.startswith("autoplan: error: --fix") and len(r.stderr.strip().splitlines()) == 1


def test_cli_no_fit_exit_3():
    r = run_cli(
        "plan",
        "--model",
        "gpt-1t",
        "--cluster",
        "dgx-a100-80gb",
        "--nodes",
        "1",
        "--global-batch",
        "8",
        "--fix",
        "offload=none",
        "--fidelity",
        "analytic",
    )
    assert r.returncode == 3
    assert "no plan fits" in r.stderr and "GiB" in r.stderr and "Traceback" not in r.stderr


def test_cli_plan_json_has_contract_fields():
    r = run_cli(
        "plan",
        "--model",
        "llama2-7b",
        "--cluster",
        "dgx-a100-80gb",
        "--nodes",
        "1",
        "--global-batch",
        "32",
        "--json",
        "--top",
        "3",
        "--jobs",
        "1",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("best", "top", "candidates_total", "candidates_feasible", "candidates_simulated", "search_time_s"):
        assert key in out
    assert out["best"]["fidelity"] == "des"
    assert out["candidates_total"] >= out["candidates_feasible"] >= out["candidates_simulated"] >= 1


def test_gpt3_on_128_nodes_keeps_tp_in_node():
    model_cluster = ("gpt3-175b", "dgx-a100-80gb")
    from simulator.model_files import load_model

    model = load_model(model_cluster[0])
    cluster = load_cluster(model_cluster[1], nodes=128)
    found = search(model, cluster, 1536, SearchOptions(top=4, jobs=2, fidelity="des"))
    assert found.best_result.job.plan.t <= 8
    ref_plan, _ = parse_plan("t=8,p=16,mb=1,ckpt=full", model, cluster.num_gpus, 1536)
    ref = simulate(Job(model, cluster, ref_plan, 1536), "des")
    assert found.best_result.step_time <= ref.step_time


def test_finalists_that_refine_to_one_plan_are_simulated_and_listed_once():
    """The main job: a ckpt=selective finalist whose best CP-SAT recomputation map is none is the
    ckpt=none finalist; it is simulated once and the top list holds distinct plans."""
    from simulator.model_files import load_model

    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", nodes=128)
    found = search(model, cluster, 1536, SearchOptions(top=8, jobs=2, fidelity="analytic"))
    plans = [r.job.plan.to_string() for r in found.top]
    assert len(set(plans)) == len(plans) == found.candidates_simulated < 8  # two refined to an earlier one
    assert found.partition_gains  # the duplicates' CP-SAT gains are still reported


def test_zero_bubble_finalists_refine_to_their_lighter_twins():
    """A recomputing zero-bubble finalist (not partitioned: CP-SAT prices 1F1B and interleaving)
    refines to the lightest recomputation that fits, so its ckpt=none twin is simulated once."""
    from autoplan.finalists import _lighter_recompute
    from simulator.model_files import load_model
    from simulator.plan import Plan

    plan = Plan(p=2, v=2, schedule="zbv", ckpt="full")
    assert [q.ckpt for q in _lighter_recompute(plan)] == ["selective", "none"]
    assert _lighter_recompute(plan.replace(ckpt="none")) == []
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", nodes=16)
    found = search(model, cluster, 256, SearchOptions(fix="t=8,p=8,schedule=zbv", top=8, fidelity="analytic"))
    assert found.partition_gains and all("ckpt=none" in g["optimized"] for g in found.partition_gains)
    labels = [r.job.plan.replace(ckpt="none").to_string() for r in found.top]
    assert len(set(labels)) == len(labels)  # no finalist is another's heavier twin


def test_finalists_drop_des_records_and_pictures_simulate_again(tmp_path):
    """The planner's workers do not send DES records (megabytes each) back unless asked;
    a plot or trace of such a result simulates the plan again, deterministically."""
    from simulator.des.plot import plot_timeline
    from simulator.des.trace import trace_events

    cluster = small_cluster(nodes=1, gpus_per_node=4)
    lean = search(SMALL, cluster, 16, SearchOptions(fix="offload=none,zero=0", top=2)).best_result
    kept = search(SMALL, cluster, 16, SearchOptions(fix="offload=none,zero=0", top=2, keep_timeline=True)).best_result
    assert "_des" not in lean.extra and "_des" in kept.extra
    assert lean.step_time == kept.step_time
    plot_timeline(lean, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000
    events = trace_events(lean)
    assert any(e["ph"] == "X" for e in events) and any(e["ph"] == "C" for e in events)


def test_fastest_plans_the_files_refuse_are_passed_over():
    """gpt3-175b on 40 DGX A100 nodes (320 GPUs), B = 1536: the fastest plans that fit are ZB-H1
    plans over p = 20 stages with m = 384 microbatches, which torch's zero-bubble schedule refuses
    (m // p = 19 rounds, and 384 is no multiple of 19: autoplan.runtime.support.unsupported_reason).
    The workers pass them over for the fastest plans autoplan's program runs; the search had kept
    the 16 fastest and then refused the size ("none of the 16 fastest plans ...")."""
    from autoplan.frameworks import load_framework
    from autoplan.frameworks.exports import files_differ
    from simulator.model_files import load_model

    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", nodes=40)
    fw = load_framework("autoplan")
    opts = SearchOptions(top=1, jobs=1, fidelity="analytic", partition=False)
    unchecked = search(model, cluster, 1536, opts).best_result  # no framework: no file rules
    assert "zbh1" in (files_differ(fw, unchecked.job) or "")  # the fastest plan: one the program refuses
    found = search(model, cluster, 1536, dataclasses.replace(opts, jobs=2, framework=fw))
    assert files_differ(fw, found.best_result.job) is None
    assert found.best_result.step_time >= unchecked.step_time


def test_a_framework_named_without_a_runtime_is_priced_with_its_own():
    """SearchOptions(framework=X) prices X's plans from X's runtime (its profile's), as
    `plan --framework X` does; a runtime given (the command line's overrides) comes first; with
    neither, the overlapped default. The search's best plan for autoplan's program named this way
    is the command line's (its default framework)."""
    from autoplan.frameworks import load_framework
    from simulator.runtime_spec import NO_DP_OVERLAP, OVERLAPPED

    program, megatron = load_framework("autoplan"), load_framework("megatron")
    assert SearchOptions(framework=program).base_runtime == program.base_runtime() != OVERLAPPED
    assert SearchOptions(framework=megatron).base_runtime == megatron.base_runtime()
    assert SearchOptions(framework=megatron, runtime=NO_DP_OVERLAP).base_runtime == NO_DP_OVERLAP
    assert SearchOptions().base_runtime == OVERLAPPED
    cluster = small_cluster(1, 8)
    by_name = search(SMALL, cluster, 32, SearchOptions(framework=program, fidelity="analytic"))
    as_cli = search(
        SMALL, cluster, 32, SearchOptions(framework=program, runtime=program.base_runtime(), fidelity="analytic")
    )
    assert by_name.best_result.job.plan == as_cli.best_result.job.plan
    assert by_name.best_result.step_time == as_cli.best_result.step_time


def test_a_global_batch_beyond_the_searchs_limit_is_one_error():
    """The search's microbatch sizes are the divisors of B / d: a batch of 2**60 took minutes to
    enumerate; beyond space_checks.MAX_GLOBAL_BATCH it is refused at once (PlanError, exit 2)."""
    from autoplan.space_checks import MAX_GLOBAL_BATCH
    from hwprofiles.errors import PlanError

    with pytest.raises(PlanError, match="at most 1,099,511,627,776 sequences"):
        search(SMALL, small_cluster(1, 8), MAX_GLOBAL_BATCH * 2, SearchOptions(fidelity="analytic"))
