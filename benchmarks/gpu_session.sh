#!/usr/bin/env bash
# One GPU session's measurements, in priority order, each bounded so the later ones still run:
# the ZeRO-3 CPU-offload run of the independent set, `autoplan calibrate --device cuda`, the
# independent set's runs (shared/gpu/h100-2026-11-26) and the small-microbatch runs, with
# a preflight of the CUDA-only calibrate paths first. Usage on a CUDA machine, with OUT the folder the results go to:
#   OUT=/path bash benchmarks/gpu_session.sh
# Results: $OUT/runs.jsonl (benchmarks/gpu_runs.py lines), $OUT/h100-calibrated.yaml,
# $OUT/session.log. `python benchmarks/gpu_compare.py --runs FILE` re-predicts the runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the results folder}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
runs() {  # group, per-run timeout (s), overall limit (s)
  log "runs $1"
  timeout "$3" "$PY" benchmarks/gpu_runs.py --out "$OUT/runs.jsonl" --cases "$1" --steps 3 --timeout "$2" 2>&1 | tee -a "$OUT/session.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee -a "$OUT/session.log"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'threads', torch.get_num_threads())" | tee -a "$OUT/session.log"
"$PY" benchmarks/gpu_preflight.py 2>&1 | tee -a "$OUT/session.log"
runs shared-offload 140 160
log "calibrate"
timeout 200 "$PY" -m autoplan calibrate --device cuda --ranks 1 --no-progress -o "$OUT/h100-calibrated.yaml" 2>&1 | tee -a "$OUT/session.log"
runs shared 60 260
runs host 60 120
log "done"
