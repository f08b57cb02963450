"""benchmarks/accuracy.py runs: its data loads and one row of each kind is predicted.

No accuracy is asserted here (the benchmark reports it); these checks only catch a broken
loader, cluster file or prediction path quickly.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

from hwprofiles.load import load_cluster
from simulator import analytic
from simulator.cost import workload
from simulator.job import Job
from simulator.runtime_spec import NO_DP_OVERLAP

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _accuracy_attention_fit as fit  # noqa: E402  (benchmarks/ on the path above)
import _accuracy_data as data  # noqa: E402


def test_vtrain_cluster_file():
    c = load_cluster("vtrain-a100")
    assert c.gpus_per_node == 8 and c.num_gpus == 512
    assert c.node.nics_per_node * c.node.nic.bandwidth_Gbps == 800  # vTrain: 800 Gb/s per node
    assert c.gpu.name.startswith("a100")


def test_vtrain_rows_load_and_one_predicts():
    single = data.vtrain_rows("ground_truth_single.csv")
    multi = data.vtrain_rows("ground_truth_multi.csv")
    assert (len(single), len(multi)) == (1440, 109)
    assert sum(r.fit_subset for r in single) == 720
    for row in (single[0], multi[0]):
        assert row.job.plan.gpus == row.job.cluster.num_gpus
        r = analytic.estimate(dataclasses.replace(row.job, runtime=NO_DP_OVERLAP))
        assert math.isfinite(r.step_time) and r.step_time > 0 and row.measured_s > 0


def test_published_row_predicts():
    rows = data.published_rows()
    assert [r.params_B for r in rows][:2] == [1.7, 7.5] and len(rows) == 5
    row = rows[0]
    from simulator.plan import parse_plan

    cluster = data.selene(row.gpus)
    plan, _ = parse_plan(f"t={row.t},p={row.p},mb=4,ckpt=full", row.model, cluster.num_gpus, row.batch)
    r = analytic.estimate(Job(row.model, cluster, plan, row.batch, NO_DP_OVERLAP))
    assert 0 < r.tflops_per_gpu < cluster.gpu.peak_tflops["fp16"]


def test_published_rows_run_as_megatron_scripts_ran_them():
    """run_table_1.sh: 145B has 80 layers on 8 stages at 5 layers per virtual stage, so v=2 interleaved;
    1T sets no virtual stages (1F1B); 1.7B uses PyTorch DDP (overlapped), 39B Megatron's local DDP."""
    jobs = {r.params_B: data.published_as_run(r) for r in data.published_rows()}
    assert (jobs[145.6].plan.schedule, jobs[145.6].plan.v, jobs[145.6].plan.mb) == ("interleaved", 2, 2)
    assert (jobs[1008.0].plan.schedule, jobs[1008.0].plan.v, jobs[1008.0].plan.mb) == ("1f1b", 1, 1)
    assert jobs[1.7].runtime.dp_overlap and not jobs[39.1].runtime.dp_overlap
    assert jobs[1.7].runtime.name == "megatron" and jobs[39.1].runtime.name == "megatron+no-dp-overlap"
    assert all(j.plan.d * j.plan.t * j.plan.p == j.cluster.num_gpus and j.plan.ckpt == "full" for j in jobs.values())


def test_megatron_vocab_padding():
    """GPT-2's 50257 tokens pad to a multiple of 128*t (Megatron's make-vocab-size-divisible-by)."""
    from simulator.specs import ModelSpec

    m = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=50257, seq_length=16)
    assert [workload.padded_vocab_size(m, t) for t in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]


def test_cpu_runs_time_about_five_seconds_of_steps():
    """ceil(5 s / predicted step), within [6, 60]: 0.5 s -> 10 steps, 0.3 s -> 17, 0.05 s -> 100
    capped at 60, 2 s -> 3 raised to 6."""
    import accuracy

    assert [accuracy.cpu_steps(x) for x in (0.5, 0.3, 0.05, 2.0)] == [10, 17, 60, 6]


def test_published_fsdp_rows_load_and_one_of_each_source_predicts():
    import _accuracy_fsdp as fsdp

    rows = fsdp.fsdp_rows()
    assert len(rows) == 162  # every row of published-fsdp.yaml, none dropped
    skipped = [r for r in rows if r.job is None]
    # the NeMo fp8 rows, whose ZeRO stage and recomputation the source does not state, each with its reason
    assert len(skipped) == 7 and all(r.skipped for r in skipped)
    fp8 = [r for r in rows if r.job is not None and r.job.plan.prec == "fp8"]
    assert len(fp8) == 12 and {r.source for r in fp8} == {"mosaicml_mpt", "dgxc_benchmarking_h100"}
    seen: set[str] = set()
    for r in rows:
        if r.job is None or r.source in seen:
            continue
        seen.add(r.source)
        res = analytic.estimate(r.job)
        assert res.fits and r.predicted_tok_s_gpu(res.step_time) > 0
        des_tok_s, des_fits = fsdp._predict(r, "des")  # the benchmark's DES column
        assert des_fits and des_tok_s > 0
    assert seen == {"mosaicml_mpt", "torchtitan_a100_64gpu", "dgxc_benchmarking_h100"}
    # the MPT A100 tables ran bf16/PURE: bf16 gradient reduction; llm-foundry's fused cross-entropy
    mpt = next(r for r in rows if r.job is not None and r.job.cluster.gpu.name == "a100-sxm4-40gb")
    assert mpt.job is not None and mpt.job.runtime.sharded_reduce_bytes == 2
    assert mpt.job.runtime.cross_entropy == "fused"


def test_a_rows_printed_command_gives_the_benchmarks_prediction(tmp_path):
    """The benchmark predicts every row through the command line's own parser and job: the command
    it prints for a row, run as a user would, gives the same step time to the last digit."""
    import json

    import _accuracy_cli as cli

    from tests.conftest import run_cli

    cli.use_models_dir(tmp_path)
    for cmd in (
        data.published_command(data.published_rows()[1]),
        data.vtrain_command(data.read_csv("ground_truth_multi.csv")[0]),
    ):
        done = run_cli(*cmd.args, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["step_time_s"] == analytic.estimate(cmd.job()).step_time
        assert cmd.shell().startswith("autoplan simulate --model ") and "--framework megatron" in cmd.shell()


def test_the_attention_fit_reads_the_long_h100_rows_and_prices_the_entry_it_is_given():
    """benchmarks/_accuracy_attention_fit.py: its fit subset is MosaicML's bf16 H100 rows with
    s >= 8192 (17 in the file); a job given another entry keeps its runtime, prices attention at
    the entry, and a faster entry gives a shorter step; the golden section finds a known minimum."""
    rows = fit.fit_rows("H100-80GB")
    assert len(rows) == 17
    assert all(r.job.model.seq_length >= 8192 and r.job.plan.prec == "bf16" for r in rows)
    job = rows[0].job
    entry = job.cluster.gpu.attention_kernels[fit.KERNEL]
    faster = fit.scaled(entry, 1.5, entry.half_seq)
    assert faster.forward_efficiency == entry.forward_efficiency * 1.5
    moved = fit.with_entry(job, faster)
    assert moved.runtime == job.runtime and moved.cluster.gpu.attention_kernels[fit.KERNEL] == faster
    assert analytic.estimate(moved).step_time < analytic.estimate(job).step_time
    x, fx = fit._golden(lambda k: (k - 1.3) ** 2 + 0.5, 0.5, 2.0, tol=1e-6)
    assert x == pytest.approx(1.3, abs=1e-5) and fx == pytest.approx(0.5)
