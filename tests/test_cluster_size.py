"""Cluster sizes beyond what a plan or the DES can handle are refused at once with one line
(exit 2), never minutes of silent work; with no --fix given, none is blamed."""

from __future__ import annotations

import pytest
from conftest import run_cli

from autoplan.space_checks import check_cluster_size, max_usable_gpus
from hwprofiles import InputError
from simulator import DES_MAX_GPUS, check_fidelity
from simulator.model_files import load_model


def test_max_usable_gpus_by_hand():
    """GPT-3 175B: 96 heads (t <= 96, and 96 divides the FFN 49152), 96 layers: B * 96 * 96."""
    assert max_usable_gpus(load_model("gpt3-175b"), 1536) == 1536 * 96 * 96
    llama = load_model("llama2-70b")  # 64 heads, 8 KV groups: t <= 8; 80 layers
    assert max_usable_gpus(llama, 1024) == 1024 * 8 * 80


def test_a_cluster_no_plan_can_fill_is_refused():
    model = load_model("tiny")
    most = max_usable_gpus(model, 8)
    check_cluster_size(model, most, 8)
    with pytest.raises(InputError, match=f"no plan can use {most + 1:,} GPUs"):
        check_cluster_size(model, most + 1, 8)


def test_des_limit():
    check_fidelity("des", DES_MAX_GPUS)
    check_fidelity("analytic", 10 * DES_MAX_GPUS)
    with pytest.raises(InputError, match="--fidelity analytic"):
        check_fidelity("des", DES_MAX_GPUS + 8)


#: 800,000 A100s for a 7B model (the DES limit is 32,768 GPUs)
HUGE = ["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--nodes", "100000", "--global-batch", "1600000"]


def test_hundred_thousand_nodes_is_refused_before_the_search():
    r = run_cli(*HUGE)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "800,000" in r.stderr and "--fidelity analytic" in r.stderr


def test_hundred_thousand_nodes_plans_with_the_analytic_estimate():
    r = run_cli(*HUGE, "--fidelity", "analytic", "--json")
    assert r.returncode == 0, r.stderr
    assert '"best"' in r.stdout


def test_no_valid_split_without_pins_does_not_blame_fix():
    r = run_cli(
        "plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "100000", "--global-batch", "1536"
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--fix" not in r.stderr and "no valid plan for 800,000 GPUs" in r.stderr
