#!/usr/bin/env bash
# GPU checks for a machine with NVIDIA GPUs and torch installed (CI has none):
# the CUDA-only tests (NCCL under the launcher, the Trainer on CUDA, AMP), then
# the PyTorch API's whole test set with a GPU visible, which moves every
# Trainer test's model and batches to cuda. Logs go to $OUT (or ./gpu-check).
#   bash scripts/gpu_check.sh
set -uo pipefail
out="${OUT:-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  nvidia-smi -L
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "devices", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
} 2>&1 | tee "$out/env.txt"
python3 -m pytest -v -p no:cacheprovider tests/test_gpu.py \
  tests/test_pytorch_trainer_amp.py 2>&1 | tee "$out/gpu_tests.txt"
gpu_rc=${PIPESTATUS[0]}
timeout 300 python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors  \
  tests/test_pytorch_*.py 2>&1 | tee "$out/pytorch_tests.txt" | tail -40
echo "gpu tests rc=$gpu_rc"
exit "$gpu_rc"
