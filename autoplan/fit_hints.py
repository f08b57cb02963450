"""What to try when no plan fits (``plan``) or the plan given does not (``simulate``).

Each setting is offered only where the node has it (autoplan.space.offloads: offload=nvme
needs NVMe drives) and the framework that will run the plan runs it
(autoplan.frameworks.space.fix_refusal: autoplan's program has no NVMe offload, Megatron-LM no
ZeRO-3); a setting only another stack runs is offered with that stack's ``--framework``.
"""

from __future__ import annotations

import math
from typing import Any

from autoplan import space
from autoplan.frameworks import FRAMEWORKS, Framework, load_framework
from autoplan.frameworks.space import fix_refusal
from autoplan.scoring import Scored, Scores
from hwprofiles.schema import ClusterSpec
from hwprofiles.units import GiB
from simulator.specs import ModelSpec

NVME = {"offload": "nvme", "zero": 3}


def runs(fw: Framework | None, model: ModelSpec, pins: dict[str, Any]) -> bool:
    """Whether ``fw`` runs some plan with ``pins`` (any stack when None: the library's search)."""
    return fw is None or fix_refusal(fw, model, pins) is None


def setting(pins: dict[str, Any], fw: Framework | None, model: ModelSpec) -> str | None:
    """``pins`` as the advice gives them ("offload=nvme with zero=3"), with ``--framework NAME`` of
    the first stack that runs them when ``fw`` does not; None when no stack does."""
    words = " with ".join(f"{k}={v}" for k, v in pins.items())
    if runs(fw, model, pins):
        return words
    other = next((name for name in FRAMEWORKS if runs(load_framework(name), model, pins)), None)
    return f"{words} under --framework {other}" if other else None


def offload_targets(cluster: ClusterSpec, fw: Framework | None, model: ModelSpec) -> list[str]:
    """The offload targets (not none) the node has and ``fw`` runs."""
    return [off for off in space.offloads(cluster.node, {}) if off != "none" and runs(fw, model, {"offload": off})]


def nvme_hint(cluster: ClusterSpec, fw: Framework | None, model: ModelSpec) -> str | None:
    """ZeRO-3 with the optimizer state on NVMe, where the node has the drives (:func:`setting`)."""
    return setting(NVME, fw, model) if "nvme" in space.offloads(cluster.node, {}) else None


def search_no_fit(
    model: ModelSpec, cluster: ClusterSpec, fix: dict[str, Any], scores: Scores, fw: Framework | None
) -> str:
    """No scored plan fits: what the smallest needed, the capacity, and what would make one fit."""
    smallest = scores.smallest
    assert smallest is not None  # scores of at least one plan
    cap = cluster.gpu.usable_memory_bytes
    need = smallest.peak_memory
    if need <= cap:  # it fits the GPU, so what it offloads does not fit the host
        return _host_no_fit(model, cluster, smallest, fw)
    hints = [f"about {math.ceil(cluster.nodes * need / cap)}+ nodes (--nodes)"]
    if fix.get("offload", "none") == "none" and "offload" in fix:
        hints.append("allowing offload (drop offload= from --fix)")
    elif not scores.offload and (targets := offload_targets(cluster, fw, model)):
        hints.append("offload=" + "/".join(targets))
    if "ckpt" in fix and fix["ckpt"] != "full":
        hints.append("ckpt=full")
    hints.append("a smaller --global-batch or --seq-len (less activation memory)")
    return (
        f"no plan fits: the smallest needs {need / GiB:.1f} GiB per GPU ({smallest.plan.to_string()}) "
        f"but each {cluster.gpu.name} has {cap / GiB:.1f} GiB usable; try " + ", or ".join(hints)
    )


def _host_no_fit(model: ModelSpec, cluster: ClusterSpec, smallest: Scored, fw: Framework | None) -> str:
    """No plan fits, and the one needing least GPU memory fits the GPU: its offloaded state
    exceeds the host memory."""
    nvme = nvme_hint(cluster, fw, model)
    return (
        f"no plan fits: the plans that fit in GPU memory (the smallest needs {smallest.peak_memory / GiB:.1f} of "
        f"{cluster.gpu.usable_memory_bytes / GiB:.1f} GiB usable: {smallest.plan.to_string()}) offload more "
        f"optimizer state than the {cluster.node.host_memory_GiB:g} GiB of host memory a node has; try more nodes "
        f"(--nodes)" + (f" or {nvme}" if nvme else "")
    )


def simulated_no_fit(
    out: dict[str, Any], host_fits: bool, cluster: ClusterSpec, fw: Framework, model: ModelSpec
) -> str:
    """Why a simulated plan (``out``: SimResult.to_dict) does not fit and what would help, from its
    memory breakdown."""
    if not host_fits:
        nvme = nvme_hint(cluster, fw, model)
        return (
            f"autoplan: the plan does not fit: the offloaded optimizer state ({out.get('host_memory_gib', 0):.0f} GiB) "
            f"exceeds host memory; try {nvme + ', or ' if nvme else ''}more nodes"
        )
    need, cap = out["peak_memory_gib"], out["memory_capacity_gib"]
    mem = out["memory_breakdown_gib"]
    plan = out["plan"]
    hints = []
    if mem["activations"] > 0.3 * need:
        hints.append("ckpt=full" if plan["ckpt"] != "full" else "a smaller mb")
        if plan["t"] > 1 and not plan["sp"]:
            hints.append("sp=1")
    if mem["optimizer"] + mem["grads"] + mem["params"] > 0.3 * need:
        more = [f"zero={z}" for z in range(plan["zero"] + 1, 4) if runs(fw, model, {"zero": z})][:1]
        hints += more or [f"offload={off}" for off in offload_targets(cluster, fw, model)][:1]
        hints.append("more pipeline stages (p) or tensor parallelism (t)")
    return (
        f"autoplan: the plan does not fit: it needs {need:.1f} GiB per GPU but {cap:.1f} GiB is usable; "
        f"try {', '.join(hints) or 'more GPUs'} (or 'autoplan plan' to search)"
    )
