"""The figures calibrate measures on a GPU, in the units the simulator reads: attention FLOPs
as executed, the attention curve's fit, fp8 GEMMs, and the committed H100 calibration's rates
against its peaks (shared/gpu/h100-2026-11-26 saw attention counted twice, above the peak)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.runtime.train import host_threads
from hwprofiles.calibrate.attention import causal_attention_flops
from hwprofiles.calibrate.fit import fit_attention_curve
from hwprofiles.load import load_gpu
from hwprofiles.schema import AttentionPoint, EagerHost

DATA = Path(__file__).resolve().parent.parent / "benchmarks/data"
H100_CALIBRATED = DATA / "h100-2026-11-26b/h100-calibrated.yaml"
H200_CALIBRATED = DATA / "h200-2026-11-27/h200-calibrated.yaml"  # made with the per-layer slope method
H100_SECOND_CALIBRATED = DATA / "h100-2026-11-27/h100-calibrated.yaml"  # likewise


def test_causal_attention_flops_is_half_the_full_matrix():
    # b=1, h=32, s=2048, d=128: QK^T and PV, 2*s*s*d multiply-adds each per head = 4*s^2*d*h
    # FLOPs over the full matrix = 6.872e10; the causal half 3.436e10
    assert causal_attention_flops(1, 32, 2048, 128) == pytest.approx(3.436e10, rel=1e-3)
    assert causal_attention_flops(2, 8, 1024, 64) == 2 * 2 * 8 * 1024**2 * 64


def test_attention_fit_recovers_the_curve_that_made_the_points():
    peak, top_f, top_b, half = 800.0, 0.8, 0.6, 1500.0
    points = [
        AttentionPoint(
            seq=s,
            head_dim=128,
            forward_tflops=peak * top_f * s / (s + half),
            backward_tflops=peak * top_b * s / (s + half),
        )
        for s in (512, 1024, 2048, 4096, 8192, 16384)
    ]
    fit = fit_attention_curve(points, peak)
    assert fit.forward_efficiency == pytest.approx(top_f, rel=0.03)
    assert fit.backward_efficiency == pytest.approx(top_b, rel=0.03)
    assert fit.half_seq == pytest.approx(half, rel=0.05)  # the grid's step is 2^(16/160) = 7%
    assert fit.rms_log_error < 0.02


@pytest.mark.parametrize(
    "profile", [H100_CALIBRATED, H200_CALIBRATED, H100_SECOND_CALIBRATED], ids=lambda p: p.parent.name
)
def test_the_committed_gpu_calibrations_have_no_rate_above_their_peaks(profile):
    g = load_gpu(str(profile))
    for pt in g.gemm.table:
        assert 0 < pt.tflops <= g.peak_tflops[pt.dtype]
    assert {pt.dtype for pt in g.gemm.table} == {"bf16", "fp16", "fp8"}
    assert g.gemm.fp8 is not None
    assert g.attention is not None and len(g.attention.table) == 12
    peak = g.peak_tflops[g.default_dtype]
    for a in g.attention.table:
        assert 0 < a.forward_tflops <= peak and 0 < a.backward_tflops <= peak
    assert 0 < g.attention.forward_efficiency <= 1 and 0 < g.attention.backward_efficiency <= 1
    # the GPU's host time of the eager program: a layer's backward runs on the autograd
    # engine's own thread, which the wall clock sees (thread CPU time read 139 us before)
    e = g.eager
    assert e is not None and e.layer_backward_us > 1000 and e.llama_layer_forward_us is not None


def test_a_llama_layer_takes_its_own_host_time_and_tp_keeps_the_ratio():
    e = EagerHost(
        layer_forward_us=100,
        layer_backward_us=200,
        tp_layer_forward_us=300,
        tp_layer_backward_us=500,
        llama_layer_forward_us=150,
        llama_layer_backward_us=260,
        embedding_forward_us=1,
        embedding_backward_us=1,
        head_forward_us=1,
        head_backward_us=1,
        optimizer_tensor_us=1,
    )
    assert e.layer_us(False) == (100, 200)
    assert e.layer_us(False, llama=True) == (150, 260)
    assert e.layer_us(True, llama=True) == pytest.approx((450, 650))  # 300 * 1.5, 500 * 1.3
    assert e.model_copy(update={"llama_layer_forward_us": None}).layer_us(False, llama=True) == (100, 200)


def test_an_offloading_gpu_rank_steps_on_its_share_of_the_cores():
    assert host_threads("none", "cuda", 8) is None
    assert host_threads("cpu", "cpu", 4) is None  # a CPU rank keeps the launcher's one thread
    threads = host_threads("cpu", "cuda", 1)
    assert threads is not None and threads >= 1
    assert host_threads("cpu", "cuda", 10**6) == 1


@pytest.mark.parametrize("name", ["h100-sxm5-80gb", "h200-sxm-141gb"])
def test_the_built_in_profiles_measured_tables_stay_below_the_datasheet_peaks(name):
    g = load_gpu(name)
    assert {pt.dtype for pt in g.gemm.table} == {"bf16", "fp16", "fp8"}
    for pt in g.gemm.table:
        assert 0 < pt.tflops <= g.peak_tflops[pt.dtype]
    assert 0.8 < g.sustained_clock < 1 and g.eager is not None
