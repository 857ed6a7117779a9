"""Pure helpers for what leaves the server: secrets redacted, charts downsampled."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

# The one redaction rule (common/redact.py), as the UI's modules have always named it.
from determined_launch.common.redact import REDACTED, as_shown, redact, redact_text

__all__ = ["REDACTED", "as_shown", "redact", "redact_text", "finite", "Extremes", "bucket_extremes"]

_LEAVES = frozenset({str, int, bool, type(None)})


def finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they are sent as null (a diverged loss shows as a gap)."""
    kind = type(value)
    if kind in _LEAVES:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):  # leaves inline: a 10,000-trial table has 200,000 values
        return {k: v if type(v) in _LEAVES else finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _LEAVES else finite(v) for v in value]
    return value


class Extremes:
    """One column's smallest and largest value per bucket of rows, kept up to
    date as rows are appended: a bucket is a power of two rows, and when there
    are more than ``max_points // 2`` buckets, neighbours merge (the size
    doubles). Following a growing million-point stream then costs the new
    rows, not a pass over all of them per poll."""

    def __init__(self, max_points: int) -> None:
        self.limit = max(1, max_points // 2)
        self.max_points = max_points
        self.size = 1
        self.n = 0
        self.lo: list[int] = []  # per bucket: the row of its minimum (-1: none)
        self.hi: list[int] = []

    def update(self, values: Sequence[float]) -> None:
        if self.n == 0 and len(values) > 4 * self.limit:
            self._bulk(values)
        lo, hi = self.lo, self.hi
        for i in range(self.n, len(values)):
            b = i // self.size
            if b == len(lo):
                lo.append(-1)
                hi.append(-1)
            v = values[i]
            if v == v:  # not NaN (a row without this metric)
                if lo[b] < 0 or v < values[lo[b]]:
                    lo[b] = i
                if hi[b] < 0 or v > values[hi[b]]:
                    hi[b] = i
            if len(lo) > self.limit:
                self._merge(values)
                lo, hi = self.lo, self.hi
        self.n = len(values)

    def _bulk(self, values: Sequence[float]) -> None:
        """A first read of a long column: the buckets at their final size at
        once, each bucket's extremes found by C loops (``min``, ``index``) instead
        of a Python loop per row; the same rows as growing one row at a time
        (the first of equal extremes). A bucket with a NaN (a row without this
        metric) or with infinities of both signs is left to the row loop."""
        n = len(values)
        while -(-n // self.size) > self.limit:
            self.size *= 2
        size, whole = self.size, (n // self.size) * self.size
        at = values.__getitem__
        for a in range(0, whole, size):
            seg = values[a:a + size]
            if sum(seg) == sum(seg):  # no NaN in it (a missing value, or inf - inf)
                self.lo.append(a + seg.index(min(seg)))
                self.hi.append(a + seg.index(max(seg)))
                continue
            present = [i for i in range(a, a + size) if at(i) == at(i)]
            self.lo.append(min(present, key=at) if present else -1)  # the first of equals
            self.hi.append(max(present, key=at) if present else -1)
        self.n = whole

    def _merge(self, values: Sequence[float]) -> None:
        def pick(rows: list[int], better: Callable[[float, float], bool]) -> list[int]:
            out = []
            for b in range(0, len(rows), 2):
                pair = [r for r in rows[b:b + 2] if r >= 0]
                best = pair[0] if pair else -1
                for r in pair[1:]:
                    if better(values[r], values[best]):
                        best = r
                out.append(best)
            return out

        self.lo = pick(self.lo, lambda a, b: a < b)
        self.hi = pick(self.hi, lambda a, b: a > b)
        self.size *= 2

    def indices(self, values: Sequence[float]) -> list[int]:
        """Rows to draw, in order; every present row of a short series, and
        always the newest (which a live chart must show)."""
        n = len(values)
        if n <= self.max_points:
            return [i for i in range(n) if values[i] == values[i]]
        keep = sorted({r for r in (*self.lo, *self.hi) if r >= 0})
        for i in range(n - 1, -1, -1):
            if values[i] == values[i]:
                if not keep or keep[-1] < i:
                    keep.append(i)
                break
        return keep


def bucket_extremes(values: Sequence[float], max_points: int) -> list[int]:
    """Indices of ``values`` to draw, at most about ``max_points``: each
    bucket's smallest and largest value, so spikes survive."""
    ext = Extremes(max_points)
    ext.update(values)
    return ext.indices(values)
