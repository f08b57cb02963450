"""Mixture of experts (issue 18, part 3): the model, its parameters, work and memory, and expert
parallelism (its states and all-to-alls), by hand."""

from __future__ import annotations

import pytest
from conftest import analytic_and_des

from autoplan.emit.deepspeed import export_deepspeed
from autoplan.emit.megatron import export_megatron
from autoplan.emit.torchtitan import export_torchtitan
from autoplan.runtime.config import TrainSettings
from autoplan.runtime.support import unsupported_reason
from autoplan.search import SearchOptions, search
from autoplan.space import expert_splits
from hwprofiles.errors import PlanError, SpecError
from hwprofiles.load import load_cluster
from simulator.analytic import estimate
from simulator.analytic.batch import estimate_batch
from simulator.cost import collectives
from simulator.cost.block_times import tp_forward
from simulator.cost.experts import all_to_all_time, dispatch_bytes, expert_tokens, moe_mlp_ops
from simulator.cost.memory import activation_bytes_per_layer
from simulator.cost.params import total_params
from simulator.cost.rank_view import rank_model
from simulator.cost.stage import stage_costs
from simulator.cost.workload import layer_forward_flops, layer_param_tensors
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan, parse_plan

MIXTRAL = load_model("mixtral-8x7b")
H100 = load_cluster("dgx-h100", 8)  # 64 GPUs


def test_mixtral_parameters_and_work_per_token():
    """46.7 B parameters, of which a token uses 12.9 B (Jiang et al. 2024): the layer forward's
    FLOPs per token are 2 x (attention's and two experts' weights) + the router, plus attention."""
    assert total_params(MIXTRAL) == 46_702_792_704
    h, f, kv, s = 4096, 14336, 1024, 4096
    per_token = 2 * (h * (h + 2 * kv) + h * h + 2 * 3 * h * f + h * 8) + 4 * s * h
    assert layer_forward_flops(MIXTRAL, 1) == per_token * s
    active = 32 * (h * (h + 2 * kv) + h * h + 2 * 3 * h * f) + 2 * 32000 * h
    assert active == pytest.approx(12.9e9, rel=0.01)
    assert layer_param_tensors(MIXTRAL) == 4 + 3 * 8 + 1  # norms, qkv, proj; 8 SwiGLU experts; router


def test_expert_ops_by_hand():
    """b=1, s=4096, k=2, E=8: each expert's grouped GEMM has 1024 rows; at t=2 fc1 is 1024 x
    14336 x 4096 per expert (SwiGLU's gate and up), fc2 1024 x 4096 x 7168."""
    assert expert_tokens(MIXTRAL, 1) == 1024
    ops = {o.name: o for o in moe_mlp_ops(MIXTRAL, 1, 2, True, 2)}
    assert (ops["expert_fc1"].m, ops["expert_fc1"].n, ops["expert_fc1"].k, ops["expert_fc1"].count) == (
        1024,
        14336,
        4096,
        8,
    )
    assert ops["expert_fc2"].flops == 2 * 1024 * 4096 * 7168 * 8
    assert ops["router"].m == 2048 and ops["router"].n == 8  # the sequence-parallel tokens
    assert ops["permute"].bytes == 2 * 4096 * 2 * 4096 * 2
    assert tp_forward(MIXTRAL) == 3 and tp_forward(load_model("llama2-7b")) == 2


def test_activations_hold_k_copies():
    """Against the same model with one dense MLP of the expert width: the MLP's activations
    double (k = 2), and the routed copies sit on every tensor rank."""
    dense = MIXTRAL.model_copy(update={"num_experts": None})
    b, t, e = 1, 2, 2
    sbh = 4096 * 4096
    extra = activation_bytes_per_layer(MIXTRAL, b, t, True, "none", e) - activation_bytes_per_layer(
        dense, b, t, True, "none", e
    )
    f_act = 3 * 14336
    mlp_split = 4096 * (e * (f_act - 14336) + e * 14336) / t  # one more copy of the split MLP activations
    router = (e * sbh + 4 * 4096 * 8) / t  # its input and fp32 probabilities, split by SP
    copies = e * 2 * sbh - e * sbh / t  # k permuted rows on every rank instead of fc1's split input
    assert extra == pytest.approx(mlp_split + router + copies)
    assert activation_bytes_per_layer(MIXTRAL, b, t, True, "full", e) == e * sbh / t


def test_hf_configs():
    mixtral = {
        "model_type": "mixtral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "hidden_act": "silu",
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-5,
        "sliding_window": None,
    }
    from simulator.model_files import model_from_hf_config

    m = model_from_hf_config(mixtral, "config.json", 4096)
    assert (m.num_experts, m.moe_router_topk, m.ffn) == (8, 2, 14336)
    assert total_params(m) == total_params(MIXTRAL)
    qwen3 = dict(mixtral, model_type="qwen3_moe", num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)
    del qwen3["num_local_experts"]
    q = model_from_hf_config(qwen3, "config.json", 4096)
    assert (q.num_experts, q.moe_router_topk, q.ffn) == (128, 8, 768)
    shared = dict(qwen3, shared_expert_intermediate_size=5632)
    with pytest.raises(SpecError, match="shared_expert_intermediate_size"):
        model_from_hf_config(shared, "config.json", 4096)
    assert model_from_hf_config(dict(mixtral, num_local_experts=1), "c.json", 4096).num_experts is None


def test_analytic_and_des_agree():
    analytic_and_des(MIXTRAL, H100, "t=2,p=4,mb=1,zero=1,sp=1", 256, 0.02, 0.01)


def test_bad_input_and_exports():
    with pytest.raises(PlanError, match="prec=fp8 with a mixture of experts is not modelled"):
        parse_plan("t=2,prec=fp8", MIXTRAL, 64, 64)
    plan, m = parse_plan("t=2,p=4,mb=1,zero=1,sp=1", MIXTRAL, 64, 64)
    job = Job(MIXTRAL, H100, plan, 64)
    args = export_megatron(job, TrainSettings()).files["megatron_args.txt"]
    assert "--num-experts 8" in args and "--moe-router-topk 2" in args and "--moe-ffn-hidden-size 14336" in args
    assert export_deepspeed(job, TrainSettings()).refused
    titan = export_torchtitan(job, TrainSettings())  # t=2 with ep=1: torchtitan splits the experts over the t ranks
    assert not titan.refused and "'num_experts': 8" in titan.files["torchtitan_config.py"]
    off_tensor_ranks = Job(MIXTRAL, H100, parse_plan("t=2,p=2,ep=4,mb=1,zero=1", MIXTRAL, 64, 64)[0], 64)
    assert (
        "torchtitan's expert parallelism borrows the tensor ranks"
        in export_torchtitan(off_tensor_ranks, TrainSettings()).refused
    )
    assert "mixture of experts: its experts are not tensor-parallel" in (unsupported_reason(MIXTRAL, plan, m) or "")
    ep_plan, m = parse_plan("ep=8,zero=0", MIXTRAL, 64, 64)
    assert unsupported_reason(MIXTRAL, ep_plan, m) is None  # the program runs it (tests/test_runtime_equivalence.py)
    assert "ep=8 with zero=1" in (unsupported_reason(MIXTRAL, ep_plan.replace(zero=1), m) or "")


def test_expert_parallel_rules():
    for text, message in [
        ("ep=3", "ep=3 does not divide the 8 experts"),
        ("t=8,p=4,ep=4", "ep=4 must divide d=2"),
        ("ep=0", "ep must be a positive integer, got 0"),
        ("ep=8,zero=3,hsdp=4", "hsdp=4 must be a multiple of ep=8"),
    ]:
        with pytest.raises(PlanError, match=message):
            parse_plan(text, MIXTRAL, 64, 64)
    with pytest.raises(PlanError, match="ep=2 \\(expert parallelism\\) needs a mixture of experts"):
        parse_plan("ep=2", load_model("llama2-7b"), 64, 64)
    plan, _ = parse_plan("t=2,ep=4", MIXTRAL, 64, 64)
    assert plan.to_string().endswith(",ep=4") and plan.gpus == 64 and plan.d == 32


def test_expert_parallel_states_by_hand():
    """ep=8, t=1: a rank holds 1 of the 8 experts of each layer, so its unsharded parameters and
    gradients shrink by 7 experts per layer, while ZeRO-1's optimizer states (each expert's over
    its d/ep = 8 ranks) are those of all 8 experts over d = 64."""
    expert = 3 * 4096 * 14336
    dense_rank = stage_costs(MIXTRAL, H100, Plan(d=64, zero=1))[0]
    ep_rank = stage_costs(rank_model(MIXTRAL, 1, 8), H100, Plan(d=64, zero=1))[0]
    assert dense_rank.params - ep_rank.params == 32 * 7 * expert
    assert ep_rank.sharded_params == dense_rank.sharded_params == dense_rank.params
    a = estimate(Job(MIXTRAL, H100, parse_plan("d=64,zero=1", MIXTRAL, 64, 256)[0], 256))
    b = estimate(Job(MIXTRAL, H100, parse_plan("d=64,zero=1,ep=8", MIXTRAL, 64, 256)[0], 256))
    assert b.memory_breakdown["optimizer"] == pytest.approx(a.memory_breakdown["optimizer"])
    assert a.memory_breakdown["params"] - b.memory_breakdown["params"] == pytest.approx(32 * 7 * expert * 2)


def test_all_to_all_by_hand():
    """ep=8 on one 8-GPU node: each dispatch sends 7/8 of the microbatch's b*s*k rows of h
    (4096 * 2 * 4096 * 2 bytes = 64 MiB) over NVLink, (ep-1) messages' latency; an imbalance of
    1.25 makes the busiest rank's rows and bytes 1.25 times larger."""
    rank = rank_model(MIXTRAL, 1, 8)
    assert dispatch_bytes(rank, 1, 1, 2) == 64 * 2**20
    bw, lat = collectives.node_link(H100).figures("send_recv")
    assert all_to_all_time(rank, H100, 1, 1, 2) == pytest.approx(7 / 8 * 64 * 2**20 / bw + 7 * lat)
    assert all_to_all_time(MIXTRAL, H100, 1, 1, 2) == 0.0
    skewed = rank_model(MIXTRAL.model_copy(update={"moe_load_imbalance": 1.25}), 1, 8)
    assert dispatch_bytes(skewed, 1, 1, 2) == 1.25 * 64 * 2**20
    assert expert_tokens(skewed, 1) == 1.25 * 4096 * 2  # one local expert takes the ep ranks' rows


def test_expert_parallel_in_every_model():
    """Analytic and DES agree, the batch model matches the scalar one, the search picks ep > 1
    for Mixtral on 64 H100 (issue 18's target) and its all-to-alls are in the trace."""
    a, d = analytic_and_des(MIXTRAL, H100, "t=2,p=2,mb=1,zero=1,sp=1,ep=4", 256, 0.02, 0.01)
    assert a.time_breakdown["ep_comm"] > 0 and d.time_breakdown["ep_comm"] > 0
    plans = [parse_plan(x, MIXTRAL, 64, 256)[0] for x in ("ep=8,zero=1", "t=2,p=2,ep=4,zero=3", "t=2,zero=2,ep=2")]
    batch = estimate_batch(MIXTRAL, H100, plans, 256)
    for i, plan in enumerate(plans):
        scalar = estimate(Job(MIXTRAL, H100, plan, 256))
        assert batch.peak_memory[i] == pytest.approx(scalar.peak_memory, rel=1e-9)
        assert batch.step_time[i] == pytest.approx(scalar.step_time if scalar.fits else float("inf"), rel=1e-9)
    assert expert_splits(load_model("llama2-7b"), 64, {}) == [1]  # dense searches unchanged
    found = search(MIXTRAL, H100, 256, SearchOptions(top=2, fidelity="des", keep_timeline=True))
    best = found.best_result
    assert best.job.plan.ep > 1
    lanes = {seg for task in best.extra["_des"].engine.info for seg, _ in getattr(task, "segments", ())}
    assert "ep" in lanes


def test_megatron_gets_the_expert_parallel_size():
    plan, _ = parse_plan("t=2,p=2,ep=4,zero=1", MIXTRAL, 64, 64)
    args = export_megatron(Job(MIXTRAL, H100, plan, 64), TrainSettings()).files["megatron_args.txt"]
    assert "--expert-model-parallel-size 4" in args
