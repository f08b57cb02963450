"""Context parallelism (issue 18, part 2): plan rules, the rank's view, the ring's cost by hand,
analytic vs DES vs batch, the long-context search and the exports."""

from __future__ import annotations

import pytest
from conftest import analytic_and_des

from autoplan import space
from autoplan.emit.deepspeed import export_deepspeed
from autoplan.emit.megatron import export_megatron
from autoplan.emit.torchtitan import export_torchtitan
from autoplan.runtime.config import TrainSettings
from autoplan.runtime.support import unsupported_reason
from autoplan.search import SearchOptions, search
from hwprofiles.errors import PlanError
from hwprofiles.load import load_cluster
from simulator.analytic import estimate, memory_only
from simulator.analytic.batch import estimate_batch
from simulator.cost import collectives, context, rank_view
from simulator.cost.attention import attention_ops
from simulator.cost.params import total_params
from simulator.cost.workload import model_flops_per_iteration
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan, parse_plan
from simulator.specs import ModelSpec

H100 = load_cluster("dgx-h100", 4)  # 32 GPUs
LLAMA = load_model("llama3-8b").with_seq_length(32768)


def job(plan_text: str, batch: int = 8, model: ModelSpec = LLAMA, cluster=H100) -> Job:
    plan, _ = parse_plan(plan_text, model, cluster.num_gpus, batch)
    return Job(model, cluster, plan, batch)


def test_plan_strings_and_rules():
    plan, m = parse_plan("t=2,cp=4,p=2,mb=1", LLAMA, 32, 8)
    assert (plan.d, plan.grad_group, plan.gpus, m) == (2, 8, 32, 4)  # d = 32 / (t*cp*p), m = B / (d*mb)
    assert plan.to_string().endswith(",cp=4") and plan.to_dict()["cp"] == 4
    assert "cp" not in Plan().to_dict() and "cp=" not in Plan().to_string()
    for text, message in [
        ("cp=0", "key 'cp': expected a positive integer"),
        ("t=2,cp=3", "t\\*cp\\*p = 2\\*3\\*1 does not divide the cluster.s 32 GPUs"),
        ("t=2,cp=4,d=2", "t\\*cp\\*p\\*d = 2\\*4\\*1\\*2 = 16 but the cluster has 32 GPUs"),
        ("t=2,cp=4,zero=3,hsdp=16", "hsdp=16 must divide d\\*cp=16"),
    ]:
        with pytest.raises(PlanError, match=message):
            parse_plan(text, LLAMA, 32, 8)
    odd = LLAMA.with_seq_length(4100)  # 4100 % (2*4) != 0: the 2*cp chunks of the causal balance
    with pytest.raises(PlanError, match="cp=4 needs seq_length=4100 divisible by 2\\*cp = 8"):
        parse_plan("t=2,cp=4", odd, 32, 8)
    scores = LLAMA.model_copy(update={"attention": "materialized"})
    with pytest.raises(PlanError, match="cp=4 \\(context parallelism\\) needs flash attention"):
        parse_plan("t=2,cp=4", scores, 32, 8)
    with pytest.raises(PlanError, match="sp=1 needs t=8 to divide the 4104/2-token sequence chunk of a rank"):
        parse_plan("t=8,cp=2,sp=1", LLAMA.with_seq_length(4104), 32, 8)  # 2052 tokens per rank


def test_rank_model_attends_over_the_whole_sequence():
    """A rank of cp = 4 computes 1/4 of the causal attention of the sequence (its two chunks
    balance the mask) in 4 ring steps, and reads all the keys and values."""
    rank = rank_view.rank_model(LLAMA, 4)
    assert (rank.seq_length, rank.attention_keys, rank_view.context_parallel(rank)) == (8192, 32768, 4)
    assert rank_view.rank_model(LLAMA, 4) is rank and rank_view.rank_model(LLAMA, 1) is LLAMA
    whole, part = attention_ops(LLAMA, 1, 16, 2)[0], attention_ops(rank, 1, 16, 2)[0]
    assert part.flops * 4 == pytest.approx(whole.flops)
    assert (part.kernels, part.m) == (4, 8192)
    kv_bytes = 2 * 1 * 32768 * 8 * 128 * 2 // 2  # K and V of all keys: 2 * b * S * kv_heads/t * head_dim * e
    q_o_bytes = 2 * 1 * 8192 * 16 * 128 * 2  # Q read and O written for the rank's tokens
    assert part.bytes == pytest.approx(kv_bytes + q_o_bytes + 4 * 16 * 8192)  # + fp32 log-sum-exp per row
    assert total_params(rank) == total_params(LLAMA)


def test_ring_by_hand():
    """t=8, cp=4 on 8-GPU nodes: the cp ranks stride 8, one per node, so the ring runs on the
    NICs: cp-1 = 3 steps of one K/V chunk, 2 * (32768/4) * 1024/8 * 2 = 4 MiB."""
    rank = rank_view.rank_model(LLAMA, 4)
    chunk = context.kv_chunk_bytes(rank, 1, 8, 2)
    assert chunk == 2 * 8192 * 1024 / 8 * 2 == 4 * 2**20
    link = context.ring_link(H100, 8, 4)
    bw, lat = link.figures("all_gather")
    forward, backward = context.ring_times(rank, H100, 8, 1, 2)
    assert forward == pytest.approx(3 * chunk / bw + 3 * lat)
    assert backward == pytest.approx(2 * forward)
    assert link.bandwidth < collectives.node_link(H100).bandwidth  # across nodes, slower than NVLink
    sigma = H100.gpu.comm_overlap_slowdown
    # beside a long attention the ring costs its contention only; beside none, all of it
    long_f, long_b = context.ring_exposure(rank, H100, 8, 1, 2, (1.0, 2.5))
    assert (long_f, long_b) == pytest.approx((sigma * forward, sigma * backward))
    assert context.ring_exposure(rank, H100, 8, 1, 2, (0.0, 0.0)) == pytest.approx((forward, backward))
    assert context.ring_exposure(LLAMA, H100, 8, 1, 2, (1.0, 1.0)) == (0.0, 0.0)


def test_cp_splits_activations_and_keeps_the_work():
    """cp=4 holds a quarter of the tokens per rank: far less activation memory, the same model
    FLOPs per step, and a cp_comm share that the DES agrees with."""
    no_cp, with_cp = job("t=8,p=1,mb=1,zero=1,ckpt=none,sp=1"), job("t=8,cp=4,p=1,mb=1,zero=1,ckpt=none,sp=1")
    assert memory_only(with_cp) < 0.5 * memory_only(no_cp)
    a, _ = analytic_and_des(LLAMA, H100, "t=8,cp=4,p=1,mb=1,zero=1,ckpt=none,sp=1", 8, 0.02, 0.02)
    assert a.model_flops == pytest.approx(model_flops_per_iteration(LLAMA, 8))
    assert a.model_flops == pytest.approx(estimate(no_cp).model_flops)
    assert a.time_breakdown["cp_comm"] > 0 and a.job.plan.cp == 4  # reported as the user's plan
    analytic_and_des(LLAMA, H100, "t=2,cp=2,p=2,mb=1,zero=1,ckpt=full,schedule=interleaved,v=2", 8, 0.02, 0.02)


def test_batch_agrees_with_the_scalar_model():
    plans = [
        parse_plan(text, LLAMA, 32, 8)[0]
        for text in (
            "t=8,cp=4,p=1,mb=1,zero=1,ckpt=none,sp=1",
            "t=2,p=4,mb=1,zero=1,ckpt=full",
            "t=4,cp=2,p=2,mb=1,zero=3,ckpt=selective,hsdp=2",
            "t=1,cp=8,p=1,mb=1,zero=2,ckpt=full,offload=cpu",
        )
    ]
    batch = estimate_batch(LLAMA, H100, plans, 8)
    for i, plan in enumerate(plans):
        scalar = estimate(Job(LLAMA, H100, plan, 8))
        assert batch.step_time[i] == pytest.approx(scalar.step_time if scalar.fits else float("inf"), rel=1e-9)
        assert batch.peak_memory[i] == pytest.approx(scalar.peak_memory, rel=1e-9)


def test_search_tries_cp_only_for_long_sequences():
    assert space.context_splits(load_model("llama3-8b"), 8, {}) == [1]  # 8k tokens: dense search unchanged
    assert space.context_splits(LLAMA, 8, {}) == [1, 2, 4]  # down to 8k tokens per rank
    assert space.context_splits(LLAMA, 8, {"cp": 8}) == [8]  # a pin tries any cp the rules allow


def test_long_context_search_finds_cp():
    """Llama-3-70B at 131,072 tokens on 512 H100 (issue 18's target): the search's best plan
    splits the sequence, and beats the best it finds with cp pinned to 1."""
    model = load_model("llama3-70b").with_seq_length(131072)
    cluster = load_cluster("dgx-h100", 64)
    opts = dict(top=2, fidelity="analytic", partition=False)
    best = search(model, cluster, 64, SearchOptions(fix="t=8,prec=bf16", **opts)).best_result
    no_cp = search(model, cluster, 64, SearchOptions(fix="t=8,prec=bf16,cp=1", **opts)).best_result
    assert best.job.plan.cp > 1 and best.fits
    assert best.step_time < no_cp.step_time
    assert best.time_breakdown["recompute"] < no_cp.time_breakdown["recompute"]  # what cp buys


def test_exports():
    plan, _ = parse_plan("t=2,cp=2,p=2,mb=1,zero=1,sp=1", LLAMA, 32, 8)
    j = Job(LLAMA, H100, plan, 8)
    megatron = export_megatron(j, TrainSettings())
    assert "--context-parallel-size 2" in megatron.files["megatron_args.txt"] and not megatron.changes
    titan = export_torchtitan(j, TrainSettings())
    assert "'context_parallel_degree': 2" in titan.files["torchtitan_config.py"]
    assert titan.written is not None and titan.written.zero == 2  # torchtitan shards over cp
    ds = export_deepspeed(j, TrainSettings())
    assert ds.written is not None and (ds.written.cp, ds.written.d) == (1, 8)
    assert unsupported_reason(LLAMA, plan, 4) is None  # autoplan's program runs it (all-gathered K/V)
