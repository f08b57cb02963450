"""Framework profiles (autoplan.frameworks): loading, the plan keys each stack runs, the runtime
each plan is priced with, and --framework on the command line (search, simulate, emit, cluster
files)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from autoplan.emit.export import TARGETS
from autoplan.emit.megatron import megatron_args
from autoplan.frameworks import FRAMEWORKS, framework_of_target, load_framework, parse_framework
from autoplan.frameworks.pricing import plan_runtime, runtime_groups
from autoplan.runtime.config import TrainSettings
from autoplan.runtime.support import DP_MODES, dp_mode, dp_mode_code
from autoplan.space import enumerate_plans
from hwprofiles.errors import SpecError
from hwprofiles.load import load_cluster
from simulator.cost.block_times import tp_overlapped
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan
from simulator.plan.table import Factor, PlanTable
from tests.conftest import run_cli

LLAMA = load_model("llama2-7b")


def test_every_profile_loads_and_each_export_target_has_one_framework():
    for name in FRAMEWORKS:
        fw = load_framework(name)
        assert fw.name == name and fw.base_runtime().name == name
    assert {t: framework_of_target(t).name for t in TARGETS} == {
        "torch": "autoplan",
        "megatron": "megatron",
        "deepspeed": "deepspeed",
        "torchtitan": "torchtitan",
    }


def test_a_profile_with_a_wrong_runtime_is_one_line_naming_the_file():
    good = load_framework("megatron").model_dump()
    with pytest.raises(SpecError, match=r"^x.yaml: runtime: not Runtime fields: dp_overlapp"):
        parse_framework({**good, "runtime": {"dp_overlapp": True}}, "x.yaml")
    with pytest.raises(SpecError, match=r"^x.yaml: runtime: zero3: Input should be 'fsdp2' or 'deepspeed'"):
        parse_framework({**good, "runtime": {"zero3": "megatron"}}, "x.yaml")
    with pytest.raises(SpecError, match=r"^x.yaml: "):
        parse_framework({**good, "runs": {**good["runs"], "schedules": ["zb"]}}, "x.yaml")


@pytest.mark.parametrize(
    ("name", "plan", "says"),
    [
        ("megatron", Plan(t=2, p=2, d=2, v=2, schedule="zbv"), "megatron does not run schedule=zbv (megatron/core/"),
        ("deepspeed", Plan(p=2, d=4, zero=2), "deepspeed does not run zero=2 with a pipeline"),
        ("deepspeed", Plan(d=8, prec="fp8"), "deepspeed does not run prec=fp8"),
        ("fsdp", Plan(t=2, d=4), "fsdp does not run t=2"),
        ("torchtitan", Plan(d=8, zero=1), "torchtitan does not run zero=1"),
        ("autoplan", Plan(d=8, zero=1, offload="cpu"), "autoplan does not run offload=cpu with zero=1"),
        ("llm-foundry", Plan(p=2, d=4), "llm-foundry does not run p=2"),
    ],
)
def test_each_stack_refuses_what_it_does_not_run_quoting_its_source(name, plan, says):
    why = load_framework(name).refusal(LLAMA, plan)
    assert why is not None and why.startswith(says)


def test_every_refusal_cites_the_stacks_source():
    """Each plan key a profile refuses, probed one at a time (and on a mixture of experts), comes
    with the citation its profile gives for that key."""
    moe = load_model("mixtral-8x7b")
    probes = [
        Plan(t=2, d=4, sp=1),
        Plan(p=2, d=4),
        Plan(cp=2, d=4),
        Plan(ep=2, d=4),
        Plan(ep=2, d=4, zero=1),
        *(
            Plan(p=2, d=4, schedule=s, v=2 if s in ("zbv", "interleaved") else 1)
            for s in ("gpipe", "zbh1", "zbv", "interleaved")
        ),
        *(Plan(d=8, zero=z) for z in (1, 2, 3)),
        Plan(p=2, d=4, zero=2),
        Plan(d=8, zero=1, prec="fp8", fp8ag=1),
        Plan(d=8, zero=1, offload="cpu"),
        Plan(d=8, zero=3, offload="nvme"),
        Plan(d=8, zero=3, hsdp=4),
        Plan(d=8, ckpt="selective"),
    ]
    for name in FRAMEWORKS:
        fw = load_framework(name)
        for plan in probes:
            for model in (LLAMA, moe):
                for why in fw.refusals(model, plan.to_dict(1)):
                    assert " (" in why and why.endswith(")"), f"{name}: {why}"


def test_what_each_stack_runs_is_refused_by_none():
    plain = Plan(d=8, zero=1)
    for name in ("autoplan", "megatron", "deepspeed"):
        assert load_framework(name).refusal(LLAMA, plain) is None
    assert load_framework("torchtitan").refusal(LLAMA, Plan(t=2, p=2, d=2, schedule="zbh1", zero=3)) is None


def _random_plans(n: int, seed: int = 1) -> list[Plan]:
    rng = random.Random(seed)
    plans = enumerate_plans(LLAMA, 64, 256, {}, 8)
    return rng.sample(plans, n)


def test_the_program_modes_of_arrays_are_the_scalar_rule():
    plans = _random_plans(300)
    cols = {k: np.array([getattr(q, k) for q in plans]) for k in ("zero", "d", "offload", "t", "p", "ep")}
    codes = dp_mode_code(cols["zero"], cols["d"], cols["offload"] == "cpu", cols["t"], cols["p"], cols["ep"])
    assert [DP_MODES[c] for c in codes.tolist()] == [dp_mode(q, q.ep) for q in plans]


def test_deepspeed_prices_the_loss_its_tensor_parallelism_runs():
    """DeepSpeed's loss: the model's F.cross_entropy at t = 1; AutoTP's gathered logits at t > 1
    without a pipeline; Megatron-DeepSpeed's vocab-parallel loss with one."""
    fw = load_framework("deepspeed")
    base = fw.base_runtime()
    plans = [Plan(t=t, p=p) for t, p in ((1, 1), (2, 1), (2, 2), (1, 4))]
    runtimes = [plan_runtime(fw, base, q, "nccl") for q in plans]
    assert [rt.loss(q.t) for rt, q in zip(runtimes, plans)] == ["torch", "gathered", "fp32", "torch"]
    # t = 1 runs the runtime of t > 1 without a pipeline: one batch group for all three
    assert runtimes[0] == runtimes[1] == runtimes[3] != runtimes[2]


@pytest.mark.parametrize("name", ["autoplan", "deepspeed"])
def test_the_search_groups_price_each_plan_with_its_own_runtime(name):
    """runtime_groups over a table gives every plan the runtime plan_runtime gives it alone."""
    fw = load_framework(name)
    base = fw.base_runtime()
    plans = _random_plans(200, seed=2)
    table = PlanTable(
        [
            Factor(
                ("t", "p", "d", "zero", "offload", "cp", "ep"),
                [(q.t, q.p, q.d, q.zero, q.offload, q.cp, q.ep) for q in plans],
                np.arange(len(plans)),
            )
        ]
    )
    for backend in ("nccl", "gloo"):
        got: dict[int, object] = {}
        groups = runtime_groups(fw, base, table, backend)
        for runtime, rows in groups:
            assert (np.diff(rows) > 0).all()  # in increasing position
            for i in rows.tolist():
                got[i] = runtime
        assert [got[i] for i in range(len(plans))] == [plan_runtime(fw, base, q, backend) for q in plans]
        # one group per distinct runtime: plans whose rules give equal runtimes are priced as one part
        assert len({runtime for runtime, _ in groups}) == len(groups)


def test_userbuffers_overlap_leaves_a_quarter_and_the_contention_of_the_rest():
    """t = 4, S = 4: 1/8 + 1/8 of the pair stays exposed; the other 0.75 runs beside 10 s of
    GEMMs at sigma = 0.3: 0.25 + 0.3 * 0.75 = 0.475 s of a 1 s pair. With nothing beside it, all of it."""
    assert tp_overlapped(1.0, 4, 10.0, 0.3) == pytest.approx(0.475)
    assert tp_overlapped(1.0, 4, 0.0, 0.3) == pytest.approx(1.0)
    assert tp_overlapped(1.0, 2, 10.0, 0.0) == pytest.approx(0.375)  # 1/4 + 1/8, the rest free


@pytest.mark.parametrize(
    "plan",
    [
        Plan(t=2, p=1, d=4, zero=1, sp=1),
        Plan(t=2, p=1, d=4, zero=0, sp=0),
        Plan(t=8, p=1, d=1, zero=0, sp=1),
        Plan(t=1, p=1, d=8, zero=3),
    ],
)
def test_megatron_files_ask_for_every_overlap_the_prediction_prices(plan):
    """Flag by flag: the overlaps in megatron_args.txt are the ones the megatron profile prices
    for the plan (gradient reduction with d > 1, parameter gathers with a sharded optimizer,
    the userbuffers TP overlap with sequence parallelism)."""
    cluster = load_cluster("dgx-h100")
    runtime = plan_runtime(load_framework("megatron"), load_framework("megatron").base_runtime(), plan, "nccl")
    job = Job(LLAMA, cluster, plan, 64, runtime)
    args = megatron_args(job, plan, TrainSettings())
    assert ("--overlap-grad-reduce" in args) == (runtime.dp_overlap and plan.d > 1)
    assert ("--overlap-param-gather" in args) == (runtime.dp_overlap and plan.d > 1 and plan.zero >= 1)
    tp_overlap = runtime.layer_kernels == "fused-tp-overlap" and plan.sp == 1 and plan.t > 1
    assert ("--tp-comm-overlap" in args) == tp_overlap


#: the job the command-line tests plan and simulate: Llama 2 7B on one DGX H100, 64 sequences
JOB = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "64")


def _plan_json(*args: str) -> dict:
    done = run_cli("plan", *JOB, "--fidelity", "analytic", "--top", "4", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", ["megatron", "deepspeed", "fsdp", "torchtitan"])
def test_plan_proposes_only_plans_the_framework_runs(name):
    out = _plan_json("--framework", name)
    fw = load_framework(name)
    for entry in [out["best"], *out["top"]]:
        assert entry["runtime"].startswith(name)
        plan = Plan(
            **{
                k: (tuple(tuple(x) for x in v) if k == "recompute" and v else v)
                for k, v in entry["plan"].items()
                if k in Plan.__dataclass_fields__
            }
        )
        assert fw.refusal(LLAMA, plan) is None, entry["plan_string"]


def test_a_pin_the_framework_does_not_run_is_one_line():
    done = run_cli("plan", *JOB, "--framework", "megatron", "--fix", "schedule=zbv")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--fix: megatron does not run schedule=zbv" in done.stderr


def test_simulate_refuses_a_plan_its_framework_does_not_run_naming_those_that_do():
    done = run_cli("simulate", *JOB, "--plan", "t=1,p=1,d=8,prec=fp8", "--fidelity", "analytic")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "autoplan does not run prec=fp8" in done.stderr and "--framework megatron or torchtitan" in done.stderr


def test_a_cluster_file_names_the_framework_and_the_option_overrides_it(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: my-h100\nnodes: 1\nnode: dgx-h100\nframework: deepspeed\n")
    base = [
        "simulate",
        "--model",
        "llama2-7b",
        "--cluster",
        str(cluster),
        "--global-batch",
        "64",
        "--plan",
        "t=1,p=1,d=8,zero=3",
        "--fidelity",
        "analytic",
        "--json",
    ]
    assert json.loads(run_cli(*base).stdout)["runtime"] == "deepspeed"
    assert json.loads(run_cli(*base, "--framework", "torchtitan").stdout)["runtime"] == "torchtitan"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: my-h100\nnodes: 1\nnode: dgx-h100\nframework: jax\n")
    done = run_cli(*base[:4], str(bad), *base[5:])
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "cluster my-h100: framework: unknown framework 'jax'" in done.stderr


def test_emit_for_a_framework_writes_its_files_and_the_program_where_it_runs_the_plan(tmp_path):
    base = ["emit", "--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8"]
    done = run_cli(*base, "--plan", "t=2,p=2,sp=1", "--framework", "megatron", "-o", tmp_path / "m")
    assert done.returncode == 0, done.stderr
    written = {p.name for p in (tmp_path / "m").iterdir()}
    assert {"megatron_args.txt", "launch.sh", "plan.json"} <= written and "ds_config.json" not in written
    done = run_cli(*base, "--plan", "t=1,p=1,d=4,zero=3", "--framework", "fsdp", "-o", tmp_path / "f")
    assert done.returncode == 0 and "autoplan writes no fsdp files" in done.stderr
    assert "launch.sh" in {p.name for p in (tmp_path / "f").iterdir()}
    done = run_cli(*base, "--plan", "t=1,p=2,d=2,v=2,schedule=zbv", "--framework", "megatron", "-o", tmp_path / "z")
    assert done.returncode == 2 and "megatron does not run schedule=zbv" in done.stderr


@pytest.mark.parametrize(
    "plan", [Plan(t=1, p=1, d=8, zero=3), Plan(t=1, p=1, d=8, zero=2), Plan(t=1, p=2, d=4, zero=1)]
)
def test_deepspeed_config_runs_the_reductions_the_prediction_prices(plan):
    """Flag by flag: ds_config.json overlaps the gradient reductions where the deepspeed profile
    prices them overlapped, and reduces in the model's dtype (bf16: no communication_data_type,
    DeepSpeed's default) where the profile prices 2-byte reductions."""
    from autoplan.emit.deepspeed import export_deepspeed

    fw = load_framework("deepspeed")
    runtime = fw.base_runtime()
    job = Job(LLAMA, load_cluster("dgx-h100"), plan, 64, runtime)
    config = json.loads(export_deepspeed(job, TrainSettings()).files["ds_config.json"])
    assert config["zero_optimization"]["overlap_comm"] == runtime.dp_overlap
    assert config["bf16"]["enabled"] and "communication_data_type" not in config
    assert runtime.sharded_reduce_bytes == 2
    buckets = config["zero_optimization"].get("reduce_bucket_size", 500_000_000)  # DeepSpeed's default
    assert buckets * 2 == runtime.dp_bucket_bytes  # the bf16 buckets the prediction holds and reduces


def test_the_gradient_buckets_are_each_stacks():
    """PyTorch DDP's 25 MB; Megatron-core's max(40M, 1M x dp) fp32 elements: 160 MB to 40 ranks,
    4 MB per rank beyond (256 MB at 64); DeepSpeed's 5e8 bf16 elements, 1 GB; numbers or arrays."""
    from simulator.cost.memory import bucket_bytes_of

    runtime = {name: load_framework(name).base_runtime() for name in ("autoplan", "megatron", "deepspeed")}
    assert bucket_bytes_of(runtime["autoplan"], 64) == 25e6
    assert [bucket_bytes_of(runtime["megatron"], d) for d in (8, 40, 64)] == [160e6, 160e6, 256e6]
    assert bucket_bytes_of(runtime["megatron"], np.array([8, 64])).tolist() == [160e6, 256e6]
    assert bucket_bytes_of(runtime["deepspeed"], 512) == 1e9


def test_torchtitans_chunked_loss_holds_an_eighth_of_the_torch_losss_peak():
    """ChunkedLossWrapper (8 chunks, each chunk's backward at once) keeps no logits between
    microbatches and at its peak one chunk's bf16 logits with the torch loss's 12 bytes:
    (2 + 12) / 8 = 1.75 bytes per logit; F.cross_entropy(logits.float()) keeps 4 and peaks 8 higher."""
    from simulator.cost.memory import kept_logits_bytes, logits_bytes_per_element, loss_transient_bytes

    assert logits_bytes_per_element("chunked", 2) == (0.0, 1.75, 1.75)
    assert kept_logits_bytes(1e9, "chunked", 2, inflight=3) == 0.0
    assert loss_transient_bytes(1e9, "chunked", 2) == (1.75e9, 1.75e9)
    assert kept_logits_bytes(1e9, "torch", 2, inflight=3) + loss_transient_bytes(1e9, "torch", 2)[1] == 20e9
    assert load_framework("torchtitan").base_runtime().cross_entropy == "chunked"


def test_a_pinned_option_key_a_stack_never_runs_is_refused_by_name():
    """--fix prec=fp8 under autoplan's program (no fp8 linears) had said only that the pins leave
    no valid plan; without a pinned ZeRO stage the option keys are checked with each stage the
    stack runs, so the refusal names the key, and a key that one stage runs passes."""
    from autoplan.frameworks.space import fix_refusal
    from simulator.model_files import load_model

    model = load_model("llama2-7b")
    program = load_framework("autoplan")
    assert "does not run prec=fp8" in fix_refusal(program, model, {"prec": "fp8"})
    assert fix_refusal(program, model, {"offload": "cpu"}) is None  # with ZeRO-3
    assert fix_refusal(load_framework("megatron"), model, {"prec": "fp8"}) is None
