"""The profiler's samples as MLflow's system metrics.

MLflow's own monitor (``mlflow.system_metrics``) logs ``system/<name>`` with a
sample counter as the step; the samples that have the same meaning get its
names here, so MLflow's System metrics tab shows them. Disk and network are
left out: ours are rates, MLflow's are totals. W&B is not sent these: it
samples the machine itself (its System tab, GPUs included, offline too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

PREFIX = "system/"
_MB_PER_GIB = 1024.0**3 / 1e6
_GPU = re.compile(r"gpu_(util|memory_used|memory_percent)_(\d+)\Z")
_GPU_NAMES = {"util": ("utilization_percentage", 1.0),
              "memory_used": ("memory_usage_megabytes", _MB_PER_GIB),
              "memory_percent": ("memory_usage_percentage", 1.0)}


def _group(record: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    group = record.get(name)
    return group if isinstance(group, Mapping) else {}


def mlflow_names(record: Mapping[str, Any]) -> dict[str, float]:
    """One ``profiler.jsonl`` record -> ``{"system/<MLflow's name>": value}``."""
    out: dict[str, float] = {}
    cpu, memory, gpu = (_group(record, g) for g in ("cpu", "memory", "gpu"))
    for name, value, scale in (("cpu_utilization_percentage", cpu.get("cpu_util_simple"), 1.0),
                               ("system_memory_usage_percentage",
                                memory.get("memory_percent"), 1.0)):
        if isinstance(value, (int, float)):
            out[PREFIX + name] = float(value) * scale
    for key, value in gpu.items():
        match = _GPU.match(key)
        if match and isinstance(value, (int, float)):
            name, scale = _GPU_NAMES[match.group(1)]
            out[f"{PREFIX}gpu_{match.group(2)}_{name}"] = float(value) * scale
    return out
