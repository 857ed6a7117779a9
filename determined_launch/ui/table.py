"""One JSON-lines stream in columns (``files.Streams`` fills it).

Rows are kept as C doubles per metric (about 8 bytes a number instead of a
dict a row). What is not a number is kept within a budget: non-numeric
values (cut at ``VALUE_CHARS``) and non-metric lines up to ``EXTRA_BYTES``
a stream, then counted in ``skipped``; a 400-digit integer is text, not a
column value (``float`` of it raises ``OverflowError``).
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Optional

#: non-metric lines and non-numeric values kept per stream (estimated bytes); more are counted
EXTRA_BYTES = 16 << 20
#: a non-numeric metric value longer than this (as text) is cut
VALUE_CHARS = 1024
#: errors of a line that is not a value we can use (deep nesting: RecursionError)
BAD_LINE = (ValueError, RecursionError, TypeError, OverflowError)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # a 400-digit integer: shown as it is, not charted
        return None


def _kept(value: Any) -> tuple[Any, int]:
    """A non-numeric metric value as kept (long text cut) and its estimated bytes."""
    if isinstance(value, (dict, list)):
        try:
            value = json.dumps(value)
        except BAD_LINE:
            value = "..."
    if isinstance(value, str) and len(value) > VALUE_CHARS:
        value = value[:VALUE_CHARS] + "..."
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        value = str(value)[:VALUE_CHARS]
    return value, 100 + (len(value) if isinstance(value, str) else 0)


class Table:
    """One JSON-lines stream in columns: ``steps``, ``times``, one column per
    numeric metric (NaN where a row lacks it), and the rare non-numeric or
    NaN values by row. ``records`` are the lines that are not metric reports
    (``checkpoints.jsonl``), kept as they are: such streams are small."""

    def __init__(self) -> None:
        self.steps = array("d")
        self.times = array("d")
        self.columns: dict[str, array[float]] = {}
        self.floats: set[str] = set()  # columns with a float value (others are sent as ints)
        self.other: dict[int, dict[str, Any]] = {}
        self.records: list[dict[str, Any]] = []
        #: lines not kept: longer than CHUNK, or past EXTRA_BYTES of records and values
        self.skipped = 0
        self._extra = 0  # estimated bytes of ``other`` and ``records``

    def nbytes(self) -> int:
        """Estimated bytes held (the columns are C doubles)."""
        return 8 * (len(self.steps) + len(self.times) + sum(len(c) for c in self.columns.values())
                    ) + self._extra + 64 * len(self.columns)

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, record: dict[str, Any]) -> None:
        metrics = record.get("metrics")
        if not isinstance(metrics, dict):
            size = _size(record)
            if self._extra + size > EXTRA_BYTES:
                self.skipped += 1
                return
            self._extra += size
            self.records.append(record)
            return
        row = len(self.steps)
        steps = _number(record.get("steps_completed"))
        self.steps.append(math.nan if steps is None else steps)
        t = _number(record.get("time"))
        self.times.append(math.nan if t is None else t)
        columns, filled = self.columns, 0
        for name, value in metrics.items():
            kind = type(value)  # exact types first: this loop runs a million times
            if kind is float and value == value:  # not NaN
                num: float = value
                self.floats.add(name)
            elif kind is int and -(1 << 63) <= value < (1 << 63):
                num = float(value)
            else:
                maybe = _number(value)
                if maybe is None or math.isnan(maybe):
                    kept, size = _kept(value)
                    if self._extra + size <= EXTRA_BYTES:
                        self._extra += size
                        self.other.setdefault(row, {})[str(name)] = kept
                    continue
                num = maybe
                if not isinstance(value, int):
                    self.floats.add(name)
            col = columns.get(name)
            if col is None:
                col = columns[name] = array("d", [math.nan]) * row
            col.append(num)
            filled += 1
        if filled < len(columns):  # a column this row lacks: NaN there
            for col in columns.values():
                if len(col) <= row:
                    col.append(math.nan)

    def row(self, i: int) -> dict[str, Any]:
        # A row being added by another thread may not be in every column yet.
        metrics: dict[str, Any] = {k: col[i] if k in self.floats else int(col[i])
                                   for k, col in self.columns.items()
                                   if i < len(col) and not math.isnan(col[i])}
        metrics.update(self.other.get(i, {}))
        step = self.steps[i]
        t = self.times[i] if i < len(self.times) else math.nan
        return {"steps_completed": None if math.isnan(step) else int(step),
                "time": None if math.isnan(t) else t,
                "metrics": metrics}

    def rows(self, indices: Optional[Sequence[int]] = None) -> Iterator[dict[str, Any]]:
        for i in range(len(self.steps)) if indices is None else indices:
            yield self.row(i)


def _size(record: dict[str, Any]) -> int:
    try:
        return 100 + len(json.dumps(record))
    except BAD_LINE:
        return 1 << 20
