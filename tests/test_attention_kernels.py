"""The fused attention kernel a stack runs, priced at the GPU profile's figures for that kernel
(hwprofiles.schema.gpu.GpuProfile.for_attention, simulator.runtime_spec.Runtime.attention_kernel)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.frameworks import load_framework
from hwprofiles.load import load_cluster
from simulator import simulate
from simulator.cost.block_times import block_times
from simulator.cost.ops import Op, attention_efficiency
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import Plan


def _flash_op(seq: int, head_dim: int, backward: bool = False) -> Op:
    """A fused attention op as simulator.cost.attention builds it (m = seq, k = head_dim)."""
    return Op("flash_attention_bwd" if backward else "flash_attention", "attention", 1.0, 0.0, seq, seq, head_dim)


def test_a_kernel_without_figures_of_its_own_runs_at_the_profiles_attention():
    h100 = load_cluster("dgx-h100").gpu
    assert h100.for_attention("sdpa") is h100
    assert h100.for_attention("te-fused") is h100
    fa2 = h100.for_attention("flash-attn-2")
    assert fa2.attention == h100.attention_kernels["flash-attn-2"] and fa2.gemm is h100.gemm
    a100 = load_cluster("dgx-a100-80gb").gpu  # Ampere: SDPA's flash backend is FlashAttention-2
    assert a100.attention_kernels == {} and a100.for_attention("flash-attn-2") is a100


def test_the_h100s_sdpa_is_its_measured_table_and_flash_attn_2_its_curve():
    h100 = load_cluster("dgx-h100").gpu
    # measured 2026-11-26: seq 2048, head dim 128: 524.3 TFLOP/s forward, 322.5 backward
    assert attention_efficiency(h100, _flash_op(2048, 128)) == pytest.approx(524.3 / 989.4, rel=1e-9)
    assert attention_efficiency(h100, _flash_op(2048, 128, True)) == pytest.approx(322.5 / 989.4, rel=1e-9)
    # between measured lengths: log-linear in log2(seq), 3072 halfway between 2048 and 4096
    assert attention_efficiency(h100, _flash_op(2896, 128)) == pytest.approx((524.3 * 579.0) ** 0.5 / 989.4, rel=2e-4)
    # flash-attn 2 (fitted 2026-11-28): 0.238 * s / (s + 1000) forward, 0.182 * s / (s + 1000) backward
    fa2 = h100.for_attention("flash-attn-2")
    assert attention_efficiency(fa2, _flash_op(2048, 128)) == pytest.approx(0.238 * 2048 / 3048)
    assert attention_efficiency(fa2, _flash_op(2048, 128, True)) == pytest.approx(0.182 * 2048 / 3048)


def test_each_stack_runs_its_own_attention_kernel():
    stacks = ("autoplan", "torchtitan", "fsdp", "deepspeed", "megatron", "llm-foundry")
    kernels = {name: load_framework(name).base_runtime().attention_kernel for name in stacks}
    assert kernels == {
        "autoplan": "sdpa",
        "torchtitan": "sdpa",
        "fsdp": "sdpa",
        "deepspeed": "sdpa",
        "megatron": "te-fused",
        "llm-foundry": "flash-attn-2",
    }


def test_a_layer_with_flash_attn_2_on_an_h100_takes_longer_by_its_attention_alone():
    model = load_model("llama2-7b")
    cluster = load_cluster("dgx-h100", 1)
    sdpa = block_times(model, cluster, 1, False, 1, "bf16", "fused", "sdpa")
    fa2 = block_times(model, cluster, 1, False, 1, "bf16", "fused", "flash-attn-2")
    assert fa2.layer.forward > sdpa.layer.forward and fa2.layer.backward > sdpa.layer.backward
    assert fa2.embedding == sdpa.embedding and fa2.head == sdpa.head
    # on an A100 both kernels are the same figures
    a100 = load_cluster("dgx-a100-80gb", 1)
    assert block_times(model, a100, 1, False, 1, "bf16", "fused", "flash-attn-2") == block_times(
        model, a100, 1, False, 1, "bf16", "fused", "sdpa"
    )


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_the_runtimes_kernel_reaches_the_estimate(fidelity):
    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100", 1)
    foundry = load_framework("llm-foundry").base_runtime()
    step = {
        kernel: simulate(
            Job(model, cluster, Plan(d=8, zero=3), 64, replace(foundry, attention_kernel=kernel)), fidelity
        )
        for kernel in ("flash-attn-2", "sdpa")
    }
    assert step["flash-attn-2"].step_time > step["sdpa"].step_time
