"""The launcher's own lines in a run's ``output.log``, read once.

``det-launch`` writes its preemption, restart and summary lines into the
run's output beside the workers' (``det-launch: job succeeded ... (exit
status 0)``). A page shows them and the run's outcome is the last summary,
so the whole log is scanned, but each byte once: a log is followed from
where the last scan ended (a 70 MiB log is read once, then only what is
appended; an unchanged one costs a ``stat``), in bounded chunks, keeping the
newest ``KEEP`` lines. A replaced or shortened file is scanned again.
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from collections.abc import Sequence
from typing import Optional

from determined_launch.ui import files
from determined_launch.ui.cache import ByteLru

#: the launcher's own lines: its preemption and restart history, its summary
LAUNCHER_LINE = re.compile(rb"^det-launch[^:\n]{0,200}: [^\n]*$", re.MULTILINE)
#: the ranks' labels (wrap_rank's ``[rank=N] ``): which ranks the log has, for its filter
RANK_LABEL = re.compile(rb"^\[rank=(\d{1,6})\] ", re.MULTILINE)
MAX_RANKS = 4096
KEEP = 200
#: a launcher line is short; a longer one is cut (it is shown, not parsed further)
LINE_CHARS = 1000
#: logs' scan states kept (estimated bytes)
CACHE_BYTES = 16 << 20


class _Scan:
    def __init__(self, key: tuple[int, int]) -> None:
        self.key = key
        self.offset = 0  # bytes scanned (always at a line start, or inside a skipped line)
        self.size = -1
        self.mtime = -1
        self.in_long_line = False  # inside a line longer than a chunk: not a launcher line
        self.ends_with_line = False  # the bytes scanned end with a launcher line
        self.lines: deque[str] = deque(maxlen=KEEP)
        #: when each line was written, as well as known: the log's mtime at the scan that
        #: found it while following (the launcher's lines carry no time); None if unknown
        self.times: deque[Optional[float]] = deque(maxlen=KEEP)
        self.ranks: set[int] = set()
        self.lock = threading.Lock()


class LauncherLines:
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = roots
        self._scans: ByteLru[_Scan] = ByteLru(CACHE_BYTES)

    def lines(self, path: str) -> list[str]:
        return self.scan(path)[0]

    def ranks(self, path: str) -> list[int]:
        """The ranks whose labelled lines the log has (none for ``exec``'s output)."""
        return self.scan(path)[1]

    def scan(self, path: str) -> tuple[list[str], list[int], list[Optional[float]]]:
        """The launcher's lines, the ranks, and when each line was written where
        known: a line that appeared while the server followed the log, and a
        line the log ends with (its mtime)."""
        real = files.confined(path, self.roots)
        if real is None:
            return [], [], []
        try:
            st = os.stat(real)
        except OSError:
            return [], [], []
        key = (st.st_dev, st.st_ino)
        scan = self._scans.get(real)
        if scan is None or scan.key != key or st.st_size < scan.offset:
            scan = _Scan(key)  # new, replaced or cut: from the start
        with scan.lock:
            if (st.st_size, st.st_mtime_ns) != (scan.size, scan.mtime):
                self._follow(real, scan, st.st_mtime if scan.size >= 0 else None)
                if scan.size < 0 and scan.ends_with_line and scan.times:
                    scan.times[-1] = st.st_mtime  # the log's last line: written at its mtime
                scan.size, scan.mtime = st.st_size, st.st_mtime_ns
            lines = list(scan.lines)
            ranks = sorted(scan.ranks)
            times = list(scan.times)
        self._scans.put(real, scan, 200 + 8 * len(ranks) + 16 * len(times)
                        + sum(len(x) for x in lines))
        return lines, ranks, times

    @staticmethod
    def _follow(path: str, scan: _Scan, when: Optional[float]) -> None:
        for chunk, end in files.whole_lines(path, scan):
            for m in LAUNCHER_LINE.finditer(chunk, 0, end):
                scan.lines.append(m.group(0)[:LINE_CHARS].decode("utf-8", errors="replace"))
                scan.times.append(when)
            last = chunk.rfind(b"\n", 0, end - 1) + 1  # the last whole line's start
            scan.ends_with_line = LAUNCHER_LINE.match(chunk, last, end) is not None
            if len(scan.ranks) < MAX_RANKS:
                scan.ranks.update(int(r) for r in set(RANK_LABEL.findall(chunk, 0, end)))
