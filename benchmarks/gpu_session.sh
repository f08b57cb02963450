#!/usr/bin/env bash
# One GPU session's measurements, in priority order, each bounded so the later ones still run
# and the whole stays within one device command (600 s): a preflight of the CUDA-only calibrate
# paths (about 30 s), the independent set's offload run (85 s), `autoplan calibrate --device cuda`
# (130 s), and as many of the independent set's runs (shared/gpu/h100-2026-11-26) as fit in
# SHARED_LIMIT_S seconds (260: its seven runs took about 38 s each on an H100, 2026-11-27);
# with PROBE=1 first, where a ZeRO-3 CPU-offload step spends its time (benchmarks/gpu_host_probe.py's
# offload part, 80 s; measured on an H200 and an H100 already). Usage on a CUDA machine, with OUT
# the folder the results go to:
#   OUT=/path bash benchmarks/gpu_session.sh
# (on an H200: CLUSTER=hgx-h200 GPU=h200, the node the runs are emitted for and the profile's name)
# Results: $OUT/runs.jsonl (benchmarks/gpu_runs.py lines), $OUT/h100-calibrated.yaml (GPU=h100),
# $OUT/session.log, and with PROBE=1 $OUT/offload.json and offload-profile.txt. `python
# benchmarks/gpu_compare.py --runs FILE --cluster NODE --gpu built-in PROFILE` re-predicts the runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the results folder}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
runs() {  # group, per-run timeout (s), overall limit (s)
  log "runs $1"
  timeout "$3" "$PY" benchmarks/gpu_runs.py --out "$OUT/runs.jsonl" --cases "$1" --steps 3 --timeout "$2" --cluster "${CLUSTER:-dgx-h100}" 2>&1 | tee -a "$OUT/session.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee -a "$OUT/session.log"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'threads', torch.get_num_threads())" | tee -a "$OUT/session.log"
timeout 40 "$PY" benchmarks/gpu_preflight.py 2>&1 | tee -a "$OUT/session.log"
if [ "${PROBE:-0}" = 1 ]; then
  log "offload probe"
  timeout 80 "$PY" benchmarks/gpu_host_probe.py --skip-eager --out "$OUT" 2>&1 | tee -a "$OUT/session.log"
fi
runs shared-offload 120 130
log "calibrate"
timeout 160 "$PY" -m autoplan calibrate --device cuda --ranks 1 --no-progress -o "$OUT/${GPU:-h100}-calibrated.yaml" 2>&1 | tee -a "$OUT/session.log"
runs shared 60 "${SHARED_LIMIT_S:-260}"
log "done"
