"""Determined's table shapes: tabulate's ``presto`` format and ``--csv``,
written here (no tabulate dependency); times in UTC as Determined prints them."""

from __future__ import annotations

import csv
import datetime
import io
from collections.abc import Sequence
from typing import Any, Optional


def format_time(ts: Optional[float]) -> Optional[str]:
    if ts is None:
        return None
    dt = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return dt.strftime("%Y-%m-%d %H:%M:%S%z")


def format_percent(f: Optional[float]) -> Optional[str]:
    return None if f is None else f"{f:.1%}"


def sizeof_fmt(val: float) -> str:
    for unit in ("", "K", "M", "G", "T", "P", "E", "Z"):
        if abs(val) < 1024.0:
            return f"{val:3.1f}{unit}B"
        val /= 1024.0
    return f"{val:.1f}YB"


def _is_number(v: Any) -> bool:
    """As tabulate decides: a number, or a string that reads as one."""
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            return False
        return True
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return format(v, "g")
    return str(v)


def _afterpoint(text: str) -> int:
    return len(text) - text.rfind(".") - 1 if "." in text else -1


def presto(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """tabulate's ``presto``: numeric columns right-aligned on their decimal
    point (their headers right-aligned too), others left; columns at least two
    wider than their header; a cell with newlines spans lines; no trailing blanks."""
    given = [[r[i] for r in rows if r[i] not in (None, "")] for i in range(len(headers))]
    numeric = [bool(vs) and all(_is_number(v) for v in vs) for vs in given]
    cells = [[_text(v).splitlines() or [""] for v in r] for r in rows]
    for i, num in enumerate(numeric):
        if num:  # pad the fraction so that decimal points line up
            points = max(_afterpoint(r[i][0]) for r in cells if r[i][0])
            for r in cells:
                if r[i][0]:
                    r[i][0] += " " * (points - _afterpoint(r[i][0]))
    widths = [max([len(h) + 2, *(len(line) for r in cells for line in r[i])])
              for i, h in enumerate(headers)]

    def line(parts: Sequence[str]) -> str:
        return "|".join(f" {p.rjust(w) if num else p.ljust(w)} "
                        for p, w, num in zip(parts, widths, numeric)).rstrip()

    out = [line(headers), "+".join("-" * (w + 2) for w in widths)]
    for r in cells:
        for k in range(max(len(c) for c in r)):
            out.append(line([c[k] if k < len(c) else "" for c in r]))
    return "\n".join(out)


def csv_text(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(headers)
    writer.writerows([[_text(v) for v in r] for r in rows])
    text = buf.getvalue()
    return text[:-2] if text.endswith("\r\n") else text


def render(headers: Sequence[str], rows: Sequence[Sequence[Any]], as_csv: bool = False) -> str:
    return csv_text(headers, rows) if as_csv else presto(headers, rows)
