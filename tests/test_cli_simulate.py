"""``autoplan simulate`` through the real CLI: the JSON contract of docs/design.md section 3."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import run_cli

from simulator.cost.workload import megatron_flops_with_recompute, model_flops_per_iteration
from simulator.model_files import load_model

FIDELITIES = ["analytic", "des"]

GPT3_ARGS = [
    "simulate",
    "--model",
    "gpt3-175b",
    "--cluster",
    "dgx-a100-80gb",
    "--nodes",
    "128",
    "--global-batch",
    "1536",
    "--plan",
    "t=8,p=16,mb=1,ckpt=full",
    "--json",
]

PLAN_KEYS = {"t", "p", "d", "mb", "num_microbatches", "zero", "ckpt", "v", "schedule", "offload", "sp"}
TOP_KEYS = {
    "plan",
    "step_time_s",
    "tflops_per_gpu",
    "mfu",
    "peak_memory_gib",
    "memory_capacity_gib",
    "fits",
    "memory_breakdown_gib",
    "time_breakdown_s",
    "bubble_fraction",
    "fidelity",
}
MEMORY_KEYS = {"params", "grads", "optimizer", "activations", "buffers"}
TIME_KEYS = {"compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble", "offload", "optimizer"}


@pytest.fixture(scope="module", params=FIDELITIES)
def gpt3(request):
    proc = run_cli(*GPT3_ARGS, "--fidelity", request.param)
    return request.param, proc


def test_gpt3_simulate_json(gpt3):
    fidelity, proc = gpt3
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert isinstance(out, dict)
    assert set(out) >= TOP_KEYS
    assert set(out["plan"]) >= PLAN_KEYS
    assert {k: out["plan"][k] for k in PLAN_KEYS} == {
        "t": 8,
        "p": 16,
        "d": 8,
        "mb": 1,
        "num_microbatches": 192,
        "zero": 0,
        "ckpt": "full",
        "v": 1,
        "schedule": "1f1b",
        "offload": "none",
        "sp": 0,
    }
    assert set(out["memory_breakdown_gib"]) >= MEMORY_KEYS
    assert set(out["time_breakdown_s"]) >= TIME_KEYS
    assert out["fidelity"] == fidelity
    for key in TOP_KEYS - {"plan", "fits", "fidelity", "memory_breakdown_gib", "time_breakdown_s"}:
        assert isinstance(out[key], (int, float)) and not isinstance(out[key], bool), key
    assert isinstance(out["fits"], bool)


def test_gpt3_simulate_numbers_are_consistent(gpt3):
    _, proc = gpt3
    out = json.loads(proc.stdout)
    step = out["step_time_s"]
    assert step > 0 and out["fits"] is True
    assert out["memory_capacity_gib"] == pytest.approx(75.0)  # 80 GiB * 0.95 - 1 GiB reserved
    assert 0 < out["peak_memory_gib"] <= out["memory_capacity_gib"]
    assert sum(out["memory_breakdown_gib"].values()) == pytest.approx(out["peak_memory_gib"], rel=1e-6)
    assert sum(out["time_breakdown_s"].values()) == pytest.approx(step, rel=0.02)
    assert 0 < out["bubble_fraction"] < 1
    # ckpt=full: tflops_per_gpu is the Megatron-LM formula's FLOPs over step time and GPUs
    model = load_model("gpt3-175b")
    F = megatron_flops_with_recompute(model, 1536)
    assert out["tflops_per_gpu"] == pytest.approx(F / (step * 1024) / 1e12, rel=1e-6)
    assert out["mfu"] == pytest.approx(model_flops_per_iteration(model, 1536) / (step * 1024 * 312e12), rel=1e-6)
    # a sane prediction for this configuration (Megatron-LM reports 138-163 TFLOP/s on Selene)
    assert 80 < out["tflops_per_gpu"] < 250


def test_nodes_override_and_node_name_as_cluster(tmp_path):
    cluster = tmp_path / "sel.yaml"
    cluster.write_text(yaml.safe_dump({"name": "sel", "nodes": 64, "node": "dgx-a100-80gb"}))
    args = [
        "simulate",
        "--model",
        "tiny",
        "--global-batch",
        "16",
        "--plan",
        "t=2,p=2",
        "--fidelity",
        "analytic",
        "--json",
    ]
    by_file = json.loads(run_cli(*args, "--cluster", cluster, "--nodes", "1").stdout)
    by_name = json.loads(run_cli(*args, "--cluster", "dgx-a100-80gb").stdout)
    assert by_file["gpus"] == by_name["gpus"] == 8 and by_file["plan"]["d"] == by_name["plan"]["d"] == 2
    assert by_file["step_time_s"] == pytest.approx(by_name["step_time_s"])


def test_human_readable_output_and_no_fit_exit_code():
    ok = run_cli(
        "simulate",
        "--model",
        "tiny",
        "--cluster",
        "dgx-a100-80gb",
        "--global-batch",
        "16",
        "--plan",
        "t=2",
        "--fidelity",
        "analytic",
    )
    assert ok.returncode == 0 and ok.stdout.strip() and "Traceback" not in ok.stderr
    # 175B parameters on one node without pipeline: 16 bytes/param / 8 GPUs does not fit
    big = run_cli(
        "simulate",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-80gb",
        "--global-batch",
        "8",
        "--plan",
        "t=8",
        "--fidelity",
        "analytic",
        "--json",
    )
    assert big.returncode == 3, big.stderr
    out = json.loads(big.stdout)
    assert out["fits"] is False and out["peak_memory_gib"] > out["memory_capacity_gib"]
    assert "GiB" in big.stderr and "Traceback" not in big.stderr


def test_zero3_runtime_picks_the_program_modelled():
    """--zero3-runtime deepspeed: bf16 reduce-scatters (half the fp32 bytes of FSDP2's) and no
    copy-out, but a fully recomputed layer gathered again in backward; the JSON says which."""
    args = [
        "simulate",
        "--model",
        "llama2-70b",
        "--cluster",
        "dgx-a100-80gb",
        "--nodes",
        "8",
        "--global-batch",
        "128",
        "--plan",
        "t=1,p=1,d=64,mb=1,zero=3,ckpt=full",
        "--fidelity",
        "analytic",
        "--json",
    ]
    fsdp = json.loads(run_cli(*args).stdout)
    ds = json.loads(run_cli(*args, "--zero3-runtime", "deepspeed").stdout)
    assert (fsdp["zero3_runtime"], ds["zero3_runtime"]) == ("fsdp2", "deepspeed")
    assert ds["step_time_s"] != pytest.approx(fsdp["step_time_s"], rel=1e-3)
    assert ds["peak_memory_gib"] == pytest.approx(fsdp["peak_memory_gib"])  # same states and activations


def test_reduce_dtype_is_honoured_for_autoplans_program():
    """--reduce-dtype bf16 halves the bytes of a ZeRO-3 plan's reduce-scatters under autoplan's
    program (the default framework), whose profile's fp32 reduce is a default the option
    overrides: the step is faster, the memory the same, and the runtime's name says so."""
    args = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64"]
    args += ["--plan", "d=8,zero=3,mb=1", "--fidelity", "analytic", "--json"]
    fp32 = json.loads(run_cli(*args).stdout)
    bf16 = json.loads(run_cli(*args, "--reduce-dtype", "bf16").stdout)
    assert bf16["runtime"] == "autoplan+reduce-bf16"
    assert bf16["step_time_s"] < fp32["step_time_s"] * 0.999
    assert bf16["peak_memory_gib"] == pytest.approx(fp32["peak_memory_gib"])
