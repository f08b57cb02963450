#!/usr/bin/env bash
# Create .venv (once) and install autoplan into it.
# torch is installed first, pinned, so no unpinned requirement pulls CUDA wheels:
#   TORCH_SPEC   the pip requirement for torch   (default: torch==2.13.0, the local CPU build)
#   TORCH_INDEX  an extra index URL for GPU builds (e.g. https://download.pytorch.org/whl/cu124)
#   EXTRAS       the optional dependency groups to install (default: test; scripts/test.sh adds
#                frameworks: DeepSpeed, torchtitan, megatron-core, torchao and transformers, for the
#                export tests)
# Everything after torch installs with the installed torch as a constraint, so no extra replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  "${pip[@]}" install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} "${TORCH_SPEC:-torch==2.13.0}"
fi
pin=.venv/torch-constraint.txt
.venv/bin/python -c 'import torch; print("torch==" + torch.__version__)' > "$pin"
DS_BUILD_OPS=0 "${pip[@]}" install -c "$pin" -e ".[${EXTRAS:-test}]"
