"""Pure helpers for what leaves the server: secrets redacted, charts downsampled."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

#: a key whose value is never shown (hparams, metadata, configs): job secrets,
#: storage credentials, database passwords, API tokens
SECRET_KEY = re.compile(
    r"(secret|passw|pwd|token|credential|private|api[_-]?key|access[_-]?key|auth"
    r"|(^|[_.-])key$)", re.IGNORECASE)
#: ``scheme://user:password@host``: the userinfo goes
URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
#: ``password=...`` / ``token: ...`` inside free text (status notes, launcher lines, logs)
TEXT_SECRET = re.compile(
    r"(?i)\b([\w.-]*(?:secret|passw|token|credential|api[_-]?key|access[_-]?key)[\w.-]*)"
    r"(\s*[=:]\s*)([^\s,;&'\")\]]+)")
REDACTED = "***"


def redact_text(text: str) -> str:
    text = URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    return TEXT_SECRET.sub(rf"\1\2{REDACTED}", text)


def redact(value: Any, depth: int = 0) -> Any:
    """``value`` with secret-looking keys' values and URL credentials replaced."""
    if depth > 32:
        return REDACTED
    if isinstance(value, Mapping):
        return {str(k): REDACTED if SECRET_KEY.search(str(k)) else redact(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, depth + 1) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they are sent as null (a diverged loss shows as a gap)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def bucket_extremes(values: Sequence[float], max_points: int) -> list[int]:
    """Indices of ``values`` to draw: in each of ``max_points // 2`` equal
    buckets its smallest and largest value (in order), so spikes survive.
    NaN (a row without the metric) is skipped; first and last are kept."""
    n = len(values)
    present = [i for i in range(n) if not math.isnan(values[i])] if n <= 2 * max_points else None
    if present is not None and len(present) <= max_points:
        return present
    buckets = max(1, max_points // 2)
    size = n / buckets
    keep: list[int] = []
    for b in range(buckets):
        lo, hi = int(b * size), min(n, int((b + 1) * size))
        best_lo = best_hi = -1
        for i in range(lo, hi):
            v = values[i]
            if v != v:  # NaN
                continue
            if best_lo < 0 or v < values[best_lo]:
                best_lo = i
            if best_hi < 0 or v > values[best_hi]:
                best_hi = i
        if best_lo >= 0:
            keep.extend(sorted({best_lo, best_hi}))
    for i in range(n - 1, -1, -1):  # the newest point, which a live chart must show
        if values[i] == values[i]:
            if not keep or keep[-1] < i:
                keep.append(i)
            break
    return keep


def downsample(columns: Mapping[str, Sequence[float]], max_points: int) -> list[int]:
    """Rows to send so that every metric's chart keeps its shape: the union of
    each column's extremes, in row order."""
    rows: set[int] = set()
    for col in columns.values():
        rows.update(bucket_extremes(col, max_points))
    return sorted(rows)
