#!/usr/bin/env bash
# Creates (once) the side environment for the PyTorch API peer: Determined
# 0.38.1's harness (determined.pytorch) with torch 2.13.0 (CPU) and
# tensorboard (Determined's Trainer imports it unconditionally). Used by
# benchmarks/bench_pytorch.py and the slow compatibility tests
# (tests/test_pytorch_compat.py). It is never a dependency of this project.
# Prints the path of the side environment's python.
set -euo pipefail
venv="${DET_PEER_TORCH_VENV:-$HOME/.cache/det-peer-torch}"
check='import determined.pytorch, torch, tensorboard'
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "$check" 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q "determined==0.38.1" "torch==2.13.0" tensorboard pyzmq >&2
  "$venv/bin/python" -c "$check" >&2
fi
echo "$venv/bin/python"
