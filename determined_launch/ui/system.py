"""A run's system metrics for the trial page: ``profiler.jsonl`` per node.

``core_context.profiler`` (core/_profiler.py) appends one line per report on
each node's local rank 0: ``{"time", "node", "host", "cpu": {...},
"memory": {...}, "disk": {...}, "network": {...}, "gpu": {...}}``. This reads
the stream's last ``TAIL_BYTES`` (bounded, whole lines; an untrusted file's
other values are skipped) and gives, per node, each metric's latest value,
its mean over what was read and its last ``MAX_POINTS`` points.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from determined_launch.ui import files

STREAM = "profiler.jsonl"
#: the newest part of the stream that is read (~10 s a line: days of samples)
TAIL_BYTES = 1 << 20
#: points per node and metric in the answer
MAX_POINTS = 600
#: a node's metrics are at most this many (a GPU has 3; 16 GPUs fit)
MAX_METRICS = 64
GROUPS = ("cpu", "memory", "gpu", "disk", "network")


def _metrics(record: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for group in GROUPS:
        values = record.get(group)
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            if isinstance(key, str) and len(key) <= 64 and not isinstance(value, bool) \
                    and isinstance(value, (int, float)) and math.isfinite(value):
                out[key] = float(value)
    return out


def summarize(records: Sequence[Any]) -> list[dict[str, Any]]:
    """Per node (ascending): ``{node, host, names, latest, mean, time, series}``."""
    nodes: dict[int, dict[str, Any]] = {}
    for record in records:
        if not isinstance(record, dict):
            continue
        node, when = record.get("node", 0), record.get("time")
        if isinstance(node, bool) or not isinstance(node, int) or not isinstance(
                when, (int, float)) or isinstance(when, bool):
            continue
        values = _metrics(record)
        entry = nodes.setdefault(node, {"node": node, "host": "", "rows": []})
        host = record.get("host")
        if isinstance(host, str) and host:
            entry["host"] = host[:255]
        entry["rows"].append((float(when), values))
    out = []
    for node in sorted(nodes):
        entry = nodes[node]
        rows = entry.pop("rows")
        names: list[str] = []
        for _, values in rows:
            names.extend(k for k in values if k not in names and len(names) < MAX_METRICS)
        sums = {k: [v[k] for _, v in rows if k in v] for k in names}
        shown = rows[-MAX_POINTS:]
        entry.update(
            names=names,
            latest={k: next(v[k] for _, v in reversed(rows) if k in v) for k in names},
            mean={k: sum(vs) / len(vs) for k, vs in sums.items()},
            time=[t for t, _ in shown],
            series={k: [v.get(k) for _, v in shown] for k in names},
            samples=len(rows))
        out.append(entry)
    return out


def system(run_dir: str, roots: Sequence[str]) -> dict[str, Any]:
    """``{"nodes": summarize(...)}`` for ``run_dir`` (empty before the first report)."""
    data, _ = files.tail_bytes(os.path.join(run_dir, STREAM), roots, None, TAIL_BYTES)
    lines = [line for line in data.split(b"\n") if line.strip()]
    return {"nodes": summarize(list(files.json_lines(lines)))}
