"""A run's output (``output.log``): its lines for the log view, a search in it,
the launcher's own lines (how the job ended), the ranks it labels, its last lines.

The log is a file from outside: read through ``files`` (confined to the served
roots, bounded reads), redacted and shown as the terminal showed it
(``shape.as_shown``) before any of it leaves the server.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Sequence
from typing import Any, Optional

from determined_launch.rundir import OUTPUT_FILE
from determined_launch.ui import files, outcome, shape
from determined_launch.ui.logscan import LauncherLines

LOG_LIMIT = 1 << 20
#: a log search (``logs?q=``) reads at most the log's last SEARCH_BYTES and
#: answers at most SEARCH_LINES lines (the newest)
SEARCH_BYTES = 64 << 20
SEARCH_LINES = 2000
#: longest search text
SEARCH_CHARS = 200
RANK_PREFIX = re.compile(rb"^\[rank=(\d+)\] ")
#: the launcher's summary line as its last word on a job (supervisor/verdict.py's summary)
SUMMARY = re.compile(r"^det-launch[^:]*: (job .*\bexit status (\d+)\)?)$")
#: bytes of the log's end read for a failed run's last lines
TAIL_BYTES = 16 << 10


class RunLogs:
    """The output of the runs under ``roots``; the launcher's lines are scanned
    once per log, from where the last scan ended (``logscan.py``)."""

    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = roots
        self._events = LauncherLines(roots)

    def logs(self, run_dir: str, rank: Optional[int], offset: Optional[int],
             limit: int = LOG_LIMIT, search: Optional[str] = None) -> tuple[str, int]:
        """The run's output (``output.log``) from ``offset`` (default: its
        last ``limit`` bytes); with ``rank``, only that rank's lines; with
        ``search``, only the lines that contain it (ASCII letters in either
        case), and without ``offset`` the log's last ``SEARCH_BYTES`` are
        searched, a ``limit`` at a time (the newest ``SEARCH_LINES`` found
        come back)."""
        path = os.path.join(run_dir, OUTPUT_FILE)
        if search is None or offset is not None:
            data, end = files.tail_bytes(path, self.roots, offset, limit)
            return _kept_lines([data], rank, search), end
        real = files.confined(path, self.roots)
        try:
            pos = max(0, os.stat(real).st_size - SEARCH_BYTES) if real else 0
        except OSError:
            pos = 0
        chunks: deque[bytes] = deque()
        found = 0  # lines in chunks
        data, end = files.tail_bytes(path, self.roots, pos, limit)
        if pos > 0:  # begin at a whole line
            cut = data.find(b"\n") + 1
            data = data[cut:] if cut else b""
        while data:
            chunks.append(_matching(data, rank, search))
            found += chunks[-1].count(b"\n")
            while found - chunks[0].count(b"\n") >= SEARCH_LINES:
                found -= chunks.popleft().count(b"\n")  # older than the newest SEARCH_LINES
            data, end = files.tail_bytes(path, self.roots, end, limit)
        return _kept_lines(list(chunks), None, search), end

    def launcher_events(self, run_dir: str) -> list[str]:
        """The launcher's own lines (preempted, restarted, failed) from the log,
        read from where the last call ended (logscan.py)."""
        return [shape.redact(line) for line in
                self._events.lines(os.path.join(run_dir, OUTPUT_FILE))]

    def launcher_timed(self, run_dir: str) -> tuple[list[str], list[Optional[float]]]:
        """``launcher_events`` and when each was written, where known (logscan.py)."""
        lines, _, times = self._events.scan(os.path.join(run_dir, OUTPUT_FILE))
        return [shape.redact(line) for line in lines], times

    def log_ranks(self, run_dir: str) -> list[int]:
        """The ranks the output labels, for the logs' rank filter."""
        return self._events.ranks(os.path.join(run_dir, OUTPUT_FILE))

    @staticmethod
    def outcome(events: Sequence[str]) -> dict[str, Any]:
        """The exit status and how the job ended, from the launcher's last
        summary line (``job succeeded on 1 node (exit status 0)``); a trial
        restarted after a failure has several, the last is its end."""
        for line in reversed(events):
            m = SUMMARY.match(line)
            if m:
                return {"exit_status": int(m.group(2)), "outcome": m.group(1)}
        return {"exit_status": None, "outcome": None}

    def modified(self, run_dir: str) -> Optional[float]:
        """When the log last changed (None: no log)."""
        real = files.confined(os.path.join(run_dir, OUTPUT_FILE), self.roots)
        try:
            return os.stat(real).st_mtime if real else None
        except OSError:
            return None

    def tail(self, run_dir: str) -> str:
        """The end of the run's own output (its exception), the launcher's lines left out."""
        data, _ = files.tail_bytes(os.path.join(run_dir, OUTPUT_FILE), self.roots, None,
                                   TAIL_BYTES)
        return shape.redact_text(outcome.output_tail(
            shape.as_shown(data.decode("utf-8", errors="replace"))))


def _matching(data: bytes, rank: Optional[int], search: Optional[str]) -> bytes:
    """The lines of ``data`` of ``rank`` (if given) that hold ``search`` (if given)."""
    if rank is None and search is None:
        return data
    needle = None if search is None else re.compile(
        re.escape(search.encode("utf-8", errors="replace")), re.IGNORECASE)
    keep = []
    for line in data.splitlines(keepends=True):
        if rank is not None:
            m = RANK_PREFIX.match(line)
            if not m or int(m.group(1)) != rank:
                continue
        if needle is None or needle.search(line):
            keep.append(line)
    return b"".join(keep)


def _kept_lines(chunks: Sequence[bytes], rank: Optional[int], search: Optional[str]) -> str:
    """``_matching``'s lines as the page gets them: redacted, and a line whose
    match was in what the redaction masked left out (a search never tells a
    secret's presence); a search answers at most ``SEARCH_LINES`` lines."""
    text = shape.redact_text(shape.as_shown(b"".join(
        _matching(c, rank, search) for c in chunks).decode("utf-8", errors="replace")))
    if search is None:
        return text
    needle = re.compile(re.escape(search), re.IGNORECASE)
    lines = [line for line in text.splitlines(keepends=True) if needle.search(line)]
    return "".join(lines[-SEARCH_LINES:])
