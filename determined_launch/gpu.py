"""Test-compat: ``det.gpu.get_gpu_uuids()``, as Determined's test helpers call it.

Determined's harness asks ``nvidia-smi`` which GPUs its container has; its
test helpers (``tests/experiment/utils.py``, ``pytorch_utils.py``) do the same
to decide whether a trial may use a GPU. This is the same question, asked the
same way. The launcher itself never uses it: it counts visible GPUs without
starting a process (``cluster/local.py``).
"""

from __future__ import annotations

import subprocess


def get_gpu_uuids() -> list[str]:
    """The UUIDs of the NVIDIA GPUs ``nvidia-smi`` lists; ``[]`` without it
    (no driver, no GPU) or when it fails."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]
