"""Samples the GPUs through NVML for 3 s and prints their rows (issue 36 §4).

    python scripts/gpu_check_nvml.py

Exit 0 either way; on a machine without a GPU, the NVIDIA driver or the
nvidia-ml-py package it prints one line saying which.
"""

from __future__ import annotations

import logging
import sys
import time

from determined_launch.core._profiler import _average, _shutdown, gpu_sample, open_nvml


def main() -> int:
    logging.basicConfig(level=logging.DEBUG, format="%(message)s")  # open_nvml's reason
    nvml = open_nvml()
    if nvml is None:
        print("no GPU metrics on this machine (see the line above); nothing to check")
        return 0
    module, handles = nvml
    try:
        print(f"NVML: {len(handles)} GPU(s), driver {module.nvmlSystemGetDriverVersion()}")
        samples = []
        for _ in range(6):  # 3 s at 0.5 s
            samples.append({"gpu": gpu_sample(module, handles)})
            time.sleep(0.5)
        for row in samples:
            print("sample", row["gpu"])
        print("mean  ", _average(samples)["gpu"])
    finally:
        _shutdown(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
