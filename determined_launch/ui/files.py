"""Reading run and experiment files: confined to the served trees, parsed once.

Two rules every read follows:

* **Confinement.** A path is opened only if its real path (symlinks
  resolved) lies under the real path of one of the served roots; anything
  else reads as missing, so a symlink out of the tree is a 404, never a leak.
* **Parse once.** JSON-lines streams (``training.jsonl`` ...) only grow.
  ``Streams`` keeps each file's parsed rows with the byte offset it reached
  and reads only what was appended since; a file that shrank or was replaced
  (another inode) is read again from the start. A million-point stream is
  parsed once, then each poll costs a ``stat``. Rows are kept in columns of
  C doubles (``array('d')``), about 8 bytes a number instead of a dict each.
  Lines are parsed a batch per ``json.loads`` (``json_lines``).
* **Untrusted.** A line that is not JSON, nests 200,000 deep or holds a
  400-digit number costs that line only (parsed alone, skipped or kept as a
  non-numeric value); a line longer than ``CHUNK`` is skipped and counted
  (``Table.skipped``), and reading goes on after it. The parsed tables are
  kept in a cache bounded in bytes (``STREAM_CACHE_BYTES``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional, Protocol

from determined_launch.ui.cache import ByteLru
from determined_launch.ui.table import BAD_LINE, Table

__all__ = ["BAD_LINE", "CHUNK", "LONG_LINE", "Streams", "Table", "confined", "dir_size",
           "json_lines", "read_json", "read_text", "sample", "tail_bytes", "whole_lines"]

#: bytes parsed per read, so a huge file never sits in memory whole
CHUNK = 8 << 20
#: lines parsed per ``json.loads`` call: 256 is as fast as 4,096 (measured) and its dicts
#: are a few hundred kB at a time
BATCH = 256
#: parsed streams kept (estimated bytes; the least recently asked for go first)
STREAM_CACHE_BYTES = 128 << 20


@functools.lru_cache(maxsize=64)
def _base(root: str) -> str:
    """A served root's real path (resolved once: the roots are fixed at start)."""
    return os.path.realpath(root)


#: directory -> (its inode, its real path): a file's real path is then its directory's
#: (one lstat of the directory to see it is the same one) unless the file is a symlink
_DIRS: dict[str, tuple[int, str]] = {}


def _realpath(path: str) -> str:
    directory, name = os.path.split(path)
    try:
        if not name or name in (".", "..") or os.path.islink(path):
            return os.path.realpath(path)
        ino = os.lstat(directory).st_ino
    except OSError:
        return os.path.realpath(path)
    hit = _DIRS.get(directory)
    if hit is None or hit[0] != ino:
        hit = _DIRS[directory] = (ino, os.path.realpath(directory))
    return os.path.join(hit[1], name)


def confined(path: str, roots: Sequence[str]) -> Optional[str]:
    """``path``'s real path if it lies under a root's real path, else None."""
    real = _realpath(path)
    for root in roots:
        base = _base(root)
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return real
    return None


def read_text(path: str, roots: Sequence[str], limit: int = 1 << 20) -> Optional[str]:
    """A small file's text (at most ``limit`` bytes), or None if missing or outside."""
    real = confined(path, roots)
    if real is None:
        return None
    try:
        with open(real, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def read_json(path: str, roots: Sequence[str]) -> Optional[dict[str, Any]]:
    text = read_text(path, roots)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None  # half-written by a crash, or not ours
    return data if isinstance(data, dict) else None


def _skip_bad(line: bytes) -> list[Any]:
    try:
        return [json.loads(line)]
    except BAD_LINE:
        return []


def json_lines(lines: Sequence[bytes],
               one: Callable[[bytes], list[Any]] = _skip_bad) -> Iterator[Any]:
    """Each line's JSON value, in order; a line that is not one JSON value
    (torn by a crash, blank, corrupt) is given to ``one``, which returns its
    values: by default none (skipped, as ``json.loads`` per line would); the
    study's journal recovers a record after a torn fragment or stops instead.

    Why batches: one ``json.loads`` of many lines as a JSON array is about
    twice as fast as a call a line (the parser is set up once and the
    repeated keys are made once). A batch that fails, or gives another number
    of values than lines, is halved until the bad line is alone, so one bad
    line costs a few parses of its neighbours. A torn line leaves a bracket
    open that no whole line closes, so it fails its batch; only lines made by
    hand to close each other's brackets could read as values they are not."""
    for start in range(0, len(lines), BATCH):
        yield from _batch(lines[start:start + BATCH], one)


def _batch(lines: Sequence[bytes], one: Callable[[bytes], list[Any]]) -> list[Any]:
    if len(lines) > 1:
        try:  # decoded here, strictly: json.loads would guess an encoding per text
            values = json.loads("[" + b",".join(lines).decode() + "]")
        except BAD_LINE:
            values = None
        if isinstance(values, list) and len(values) == len(lines):
            return values
        half = len(lines) // 2
        return _batch(lines[:half], one) + _batch(lines[half:], one)
    return one(lines[0]) if lines else []


class _Entry:
    def __init__(self) -> None:
        self.key: tuple[int, int] = (-1, -1)  # (device, inode)
        self.offset = 0
        self.size = -1
        self.mtime = -1
        self.table = Table()
        self.lock = threading.Lock()
        self.in_long_line = False  # the offset is inside a line longer than CHUNK


class Streams:
    """Parsed JSON-lines files by path, each followed from where it was left;
    at most about ``STREAM_CACHE_BYTES`` of them kept (a stream left out is
    read again when asked for)."""

    def __init__(self, limit: int = STREAM_CACHE_BYTES) -> None:
        self._entries: ByteLru[_Entry] = ByteLru(limit)
        self._lock = threading.Lock()

    def get(self, path: str, roots: Sequence[str]) -> Table:
        """The stream's rows so far (an empty table if missing or outside).

        An unchanged file costs one ``stat``: the same inode, size and mtime
        as when its real path was checked. Any change (a file swapped for a
        symlink out of the tree is another inode) checks the path again."""
        try:
            st = os.stat(path)
        except OSError:
            return Table()
        key = (st.st_dev, st.st_ino)
        entry = self._entries.get(path)
        if (entry is not None and entry.key == key and entry.size == st.st_size
                and entry.mtime == st.st_mtime_ns):
            return entry.table
        real = confined(path, roots)
        if real is None:
            return Table()
        with self._lock:
            entry = self._entries.get(path)
            if entry is None:
                entry = _Entry()
                self._entries.put(path, entry, 0)
        with entry.lock:
            if key != entry.key or st.st_size < entry.offset:
                entry.key, entry.offset, entry.table = key, 0, Table()  # replaced or truncated
                entry.in_long_line = False
            elif st.st_size == entry.size and st.st_mtime_ns == entry.mtime:
                return entry.table
            self._follow(real, entry)  # the stat above may be older: offsets rule
            entry.size, entry.mtime = st.st_size, st.st_mtime_ns
            self._entries.put(path, entry, entry.table.nbytes())
            return entry.table

    def backlog(self, path: str) -> int:
        """Bytes of ``path`` not parsed yet (falls while a read is under way)."""
        try:
            st = os.stat(path)
        except OSError:
            return 0
        entry = self._entries.get(path)
        if entry is None or entry.key != (st.st_dev, st.st_ino) or st.st_size < entry.offset:
            return st.st_size
        return st.st_size - entry.offset

    @staticmethod
    def _follow(path: str, entry: _Entry) -> None:
        def long_line() -> None:  # skipped and counted
            entry.table.skipped += 1

        for chunk, end in whole_lines(path, entry, long_line):
            for record in json_lines(chunk[:end].splitlines()):
                if isinstance(record, dict):
                    try:
                        entry.table.add(record)
                    except BAD_LINE:  # an odd record costs itself only
                        entry.table.skipped += 1


class Cursor(Protocol):
    """Where a followed file was left: ``offset`` is at a line start, or inside
    a line longer than ``CHUNK`` when ``in_long_line``."""

    offset: int
    in_long_line: bool


def whole_lines(path: str, at: Cursor, on_long_line: Callable[[], None] = lambda: None
                ) -> Iterator[tuple[bytes, int]]:
    """The whole lines appended to ``path`` since ``at``, as ``(chunk, end)``:
    ``chunk[:end]`` is a block of them, read ``CHUNK`` bytes at a time (bounded
    memory). A line still being written waits for its newline; a line longer
    than a chunk is skipped (``on_long_line`` once) and following goes on after
    it. ``at`` moves past each block once the consumer has taken it."""
    try:
        f = open(path, "rb")
    except OSError:
        return
    with f:
        while True:
            f.seek(at.offset)
            chunk = f.read(CHUNK)
            full = len(chunk) == CHUNK
            if at.in_long_line:  # the rest of a line too long to keep
                cut = chunk.find(b"\n") + 1
                at.offset += cut or len(chunk)
                at.in_long_line = not cut
                if full or cut:
                    continue
                return
            end = chunk.rfind(b"\n") + 1
            if end == 0:
                if full:
                    on_long_line()
                    at.in_long_line = True
                    at.offset += len(chunk)
                    continue
                return
            yield chunk, end
            at.offset += end
            if not full:
                return  # the end of the file (no second read to learn it)


def sample(path: str, roots: Sequence[str], n: int) -> Table:
    """About ``n`` rows spread evenly over a stream by byte offset, and its
    last whole row: a preview read with ``n`` seeks instead of a parse of
    every line (a million-line stream: milliseconds instead of seconds)."""
    table = Table()
    real = confined(path, roots)
    if real is None:
        return table
    try:
        with open(real, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            lines: list[bytes] = []
            seen = -1
            for i in range(n):
                f.seek(size * i // n)
                if i:
                    f.readline(CHUNK)  # the rest of the line the seek landed in
                pos = f.tell()
                if pos >= size:
                    break
                if pos <= seen:
                    continue  # lines longer than the spacing: this one is read already
                seen = pos
                lines.append(f.readline(CHUNK))  # a longer line is cut: not a row
            base = max(0, size - 65536)
            f.seek(base)
            tail = f.read()
    except OSError:
        return table
    end = tail.rfind(b"\n")
    start = tail.rfind(b"\n", 0, max(end, 0)) + 1
    if end >= 0 and base + start > seen and (start > 0 or base == 0):
        lines.append(tail[start:end + 1])  # the newest row: the chart reaches the present
    lines = [x for x in lines if x.endswith(b"\n")]  # a line still being written is not a row
    for record in json_lines([x.rstrip(b"\r\n") for x in lines]):
        if isinstance(record, dict):
            table.add(record)
    return table


#: what ends a line of output: a newline, or a carriage return (a tqdm bar redraws
#: its line with ``\r`` and never writes ``\n``)
_LINE_END = re.compile(rb"[\r\n]")
#: appended to a piece of a line longer than the read limit (the rest follows)
LONG_LINE = b" [det-launch ui: line longer than the read limit; continued]\n"


def tail_bytes(path: str, roots: Sequence[str], offset: Optional[int],
               limit: int) -> tuple[bytes, int]:
    """Bytes of a growing text file from ``offset`` (None: its last ``limit``
    bytes, from a line start), at most ``limit``; and the offset reached.
    Whole lines only, except a line longer than ``limit``: its first
    ``limit`` bytes are given with the ``LONG_LINE`` marker, and the next
    call goes on after them (following never stalls on it)."""
    real = confined(path, roots)
    if real is None:
        return b"", 0
    try:
        with open(real, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - limit) if offset is None else min(max(0, offset), size)
            f.seek(start)
            data = f.read(limit)
    except OSError:
        return b"", 0
    if offset is None and start > 0:
        m = _LINE_END.search(data)
        cut = m.end() if m else 0  # begin at a whole line
        data, start = data[cut:], start + cut
    end = _last_line_end(data)  # a line still being written waits for its end
    if end == 0 and len(data) >= limit:
        return data + LONG_LINE, start + len(data)
    return data[:end], start + end


def _last_line_end(data: bytes) -> int:
    return max(data.rfind(b"\n"), data.rfind(b"\r")) + 1


def dir_size(path: str, roots: Sequence[str]) -> Optional[int]:
    """Bytes in a directory tree (symlinks not followed), or None if outside."""
    real = confined(path, roots)
    if real is None or not os.path.isdir(real):
        return None
    total = 0
    for top, _dirs, files in os.walk(real):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total
