"""Exercise once, at small sizes, each CUDA-only path of ``autoplan calibrate`` (fp8 GEMM,
causal attention forward and backward, the eager blocks under autocast, the fused host AdamW),
printing each one's figure or its error, so that a GPU session learns in seconds what would
fail in the full calibration. Run on a CUDA machine: ``python benchmarks/gpu_preflight.py``."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hwprofiles.calibrate import eager, host
from hwprofiles.calibrate.attention import measure_attention
from hwprofiles.calibrate.gemm import measure_gemm
from hwprofiles.calibrate.settings import settings_for


def _try(name: str, fn: Callable[[], object]) -> None:
    try:
        print(f"preflight {name}: {fn()}", flush=True)
    except Exception:
        print(f"preflight {name}: FAILED\n{traceback.format_exc()}", flush=True)


def main() -> None:
    s = replace(settings_for("cuda", True), gemm_dims_m=(256,), gemm_dims_nk=(256, 4096))
    s = replace(s, attention_shapes=((1, 16, 1024, 128),), adam_params=1 << 20)
    _try("gemm", lambda: measure_gemm(s, lambda _: None))
    _try("attention", lambda: measure_attention(s, "bf16", lambda _: None))
    _try("eager", lambda: eager.measure_eager("cuda", 2, lambda _: None))
    _try("host adam GB/s", lambda: host.measure_host_adam(s, lambda _: None))
    _try("host gradient sum and norm", lambda: host.measure_host_streams(s, lambda _: None))


if __name__ == "__main__":
    main()
