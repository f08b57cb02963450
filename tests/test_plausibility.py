"""No plan of a built-in model on a built-in cluster promises more than its kernels deliver
(issue 19's plausibility guard), and the plan output names the best published MFU."""

from __future__ import annotations

import pytest

from autoplan.search import SearchOptions, search
from hwprofiles.errors import AutoplanError
from hwprofiles.load import builtin_nodes, load_cluster
from simulator.model_files import builtin_models, load_model
from simulator.plausibility import kernel_ceiling, published_best

MODELS = [m for m in builtin_models() if m not in ("tiny", "gpt-1t")]  # gpt-1t fits no 16-node cluster
GPU_NODES = [n for n in builtin_nodes() if load_cluster(n).node.backend == "nccl"]


@pytest.mark.parametrize("node", GPU_NODES)
def test_no_plan_exceeds_what_its_kernels_deliver(node: str) -> None:
    cluster = load_cluster(node, nodes=16)
    searched = 0
    for name in MODELS:
        try:
            found = search(load_model(name), cluster, 512, SearchOptions(fidelity="analytic", top=4, partition=False))
        except AutoplanError:  # nothing fits this model on 16 such nodes
            continue
        searched += 1
        for r in found.top:
            ceiling = kernel_ceiling(cluster.gpu, r.job.plan.prec)
            assert 0 < r.mfu <= ceiling, f"{name} {r.job.plan}: MFU {r.mfu:.3f} above the GEMM ceiling {ceiling}"
    assert searched, f"no built-in model fits 16 {node} nodes"


def test_published_best_mfu_per_gpu_class() -> None:
    a100 = published_best(load_cluster("dgx-a100-80gb").gpu)
    h100 = published_best(load_cluster("dgx-h100").gpu)
    assert a100 is not None and a100.mfu == pytest.approx(0.611)  # torchtitan Llama 2 13B row
    assert h100 is not None and h100.mfu == pytest.approx(0.499)  # DGX Cloud GPT-3 175B bf16 row
    assert published_best(load_cluster("dgx2-v100").gpu) is None
    h100_fp8 = published_best(load_cluster("dgx-h100").gpu, "fp8")
    assert h100_fp8 is not None and h100_fp8.mfu == pytest.approx(888 / 1979)  # NeMo 24.07 GPT-3 175B fp8 row
    assert published_best(load_cluster("dgx-a100-80gb").gpu, "fp8") is None


def test_fp8_kernel_ceiling_is_the_fp8_gemm_curve() -> None:
    h100 = load_cluster("dgx-h100").gpu
    assert kernel_ceiling(h100, "fp8") == pytest.approx(0.80)  # tilelang/DeepGEMM fp8 figures (profile)
    assert kernel_ceiling(h100) == pytest.approx(0.75)
