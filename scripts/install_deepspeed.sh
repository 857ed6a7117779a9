#!/usr/bin/env bash
# Install DeepSpeed 0.19.8 for the CPU torch 2.13 and build its CPU comm op once.
#
# torch is pinned so pip never swaps the CPU wheel for a multi-GB CUDA one.
# DeepSpeed's CPU accelerator JIT-compiles a C++ op (deepspeed_shm_comm) on
# the first deepspeed.init_distributed(); that takes ~30 s on an idle 2-core
# machine (minutes on a busy one). We build it here, into
# TORCH_EXTENSIONS_DIR (default: a cache outside the repository), so tests
# and jobs that use the same TORCH_EXTENSIONS_DIR start fast. Idempotent.
#
# Environment:
#   PYTHON                interpreter (default: python3)
#   DET_LAUNCH_CACHE      cache root (default: ~/.cache/determined_launch)
#   TORCH_EXTENSIONS_DIR  default: $DET_LAUNCH_CACHE/torch_extensions
set -euo pipefail

PYTHON=${PYTHON:-python3}
CACHE=${DET_LAUNCH_CACHE:-$HOME/.cache/determined_launch}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$CACHE/torch_extensions}
mkdir -p "$TORCH_EXTENSIONS_DIR"

if ! "$PYTHON" -c 'import deepspeed, sys; sys.exit(deepspeed.__version__ != "0.19.8")' 2>/dev/null; then
    echo "install_deepspeed: pip install deepspeed==0.19.8 (torch pinned to 2.13.0)"
    "$PYTHON" -m pip install --quiet "deepspeed==0.19.8" "torch==2.13.0"
fi

# torch's JIT build guards its directory with a "lock" file and waits
# forever while it exists; a build that was killed leaves it behind. Ours
# is the only build at install time, so a lock older than 5 minutes is stale.
find "$TORCH_EXTENSIONS_DIR" -maxdepth 2 -name lock -mmin +5 -print -delete 2>/dev/null \
    | sed 's/^/install_deepspeed: removed stale /' || true

start=$(date +%s)
"$PYTHON" - <<'PY'
from deepspeed.accelerator import get_accelerator

builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is None:
    print("install_deepspeed: no shm comm op for this accelerator; nothing to build")
else:
    builder.load(verbose=False)
    print(f"install_deepspeed: {builder.absolute_name()} ready")
PY
echo "install_deepspeed: op ready in $(( $(date +%s) - start )) s (TORCH_EXTENSIONS_DIR=$TORCH_EXTENSIONS_DIR)"
