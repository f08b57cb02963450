"""The no-fit advice offers only what the node has and the framework runs (autoplan.fit_hints)."""

from __future__ import annotations

from autoplan import fit_hints
from autoplan.cli import main
from autoplan.frameworks import load_framework
from hwprofiles import load_cluster
from simulator.model_files import load_model

ONE_DGX_H100 = ["--model", "gpt-1t", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "8"]


def test_a_host_that_cannot_hold_the_offloaded_state_is_told_which_stack_offloads_to_nvme(capsys):
    """gpt-1t's Adam state offloaded from one DGX H100 is about 16 TB against 2 TB of host memory;
    autoplan's program has no NVMe offload, DeepSpeed's ZeRO-Infinity has (and plans it)."""
    assert main(["plan", *ONE_DGX_H100, "--fidelity", "analytic"]) == 3
    err = capsys.readouterr().err
    assert "offload more optimizer state than the 2048 GiB of host memory" in err, err
    assert err.endswith("try more nodes (--nodes) or offload=nvme with zero=3 under --framework deepspeed\n"), err
    assert main(["plan", *ONE_DGX_H100, "--framework", "deepspeed", "--fidelity", "analytic"]) == 0
    assert "offload=nvme" in capsys.readouterr().out


def test_nvme_is_not_offered_on_a_node_without_drives():
    model, cluster = load_model("gpt-1t"), load_cluster("dgx-a100-80gb", 1)
    no_drives = cluster.model_copy(update={"node": cluster.node.model_copy(update={"nvme": None})})
    assert fit_hints.nvme_hint(no_drives, load_framework("deepspeed"), model) is None
    assert fit_hints.nvme_hint(cluster, load_framework("deepspeed"), model) == "offload=nvme with zero=3"


def test_offload_targets_are_those_the_framework_runs():
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", 1)
    assert fit_hints.offload_targets(cluster, load_framework("deepspeed"), model) == ["cpu", "nvme"]
    assert fit_hints.offload_targets(cluster, load_framework("megatron"), model) == ["cpu"]
    assert fit_hints.offload_targets(cluster, None, model) == ["cpu", "nvme"]
