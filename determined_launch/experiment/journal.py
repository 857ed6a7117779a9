"""The study's journal file, safe against a worker killed mid-append.

Optuna's ``JournalFileBackend`` skips an unfinished last line on read, but
appends the next record right after it; the spliced line then fails every
later read (``Expecting ',' delimiter``, optuna issue #5138), so one SIGKILL
ends a study for good. Here:

* an unfinished last line is not a record (readers never count it);
* an append first cuts such a fragment off (under the journal's lock, so no
  live writer owns it), so records always start on a fresh line and the file
  stays readable by stock Optuna (optuna-dashboard, users' scripts);
* a line spliced by an older writer (fragment + whole record) yields the
  record after the fragment;
* any other corrupt line stops the read with its line number: replay is
  positional (trial ids are counts of ``create_trial`` records), so skipping a
  record could silently renumber trials.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any, Optional

from determined_launch.errors import LaunchError

#: Optuna writes each record as compact JSON starting with its op code
_RECORD_START = b'{"op_code":'
#: seconds before a lock left by a killed worker is taken over (optuna #5921)
LOCK_GRACE_S = 30


def backend(optuna: Any, path: str) -> Any:
    """A ``JournalFileBackend`` for ``path`` with the recovery above."""

    class TornSafeJournal(optuna.storages.journal.JournalFileBackend):
        def __init__(self) -> None:
            lock = optuna.storages.journal.JournalFileSymlinkLock(path,
                                                                  grace_period=LOCK_GRACE_S)
            super().__init__(path, lock_obj=lock)
            self._lock_obj = lock
            self._offsets: dict[int, int] = {0: 0}  # record number -> byte offset of its line
            self._reported: set[int] = set()

        def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
            start = max((n for n in self._offsets if n <= log_number_from), default=0)
            with open(path, "rb") as f:
                f.seek(self._offsets[start])
                number, offset = start, self._offsets[start]
                for line in f:
                    if not line.endswith(b"\n"):
                        return  # being written, or torn: not a record (yet)
                    record = self._parse(line, number)
                    offset += len(line)
                    number += 1
                    self._offsets[number] = offset
                    if number > log_number_from:
                        yield record

        def _parse(self, line: bytes, number: int) -> dict[str, Any]:
            record, spliced = record_of(line)
            if record is None:
                raise LaunchError(f"study storage {path}: line {number + 1} is not a journal "
                                  "record; the study cannot be replayed past it (move the file "
                                  "aside, or cut it before that line to keep the trials above)")
            if spliced and number not in self._reported:
                self._reported.add(number)
                _note(f"study storage {path}: line {number + 1} starts with a torn record "
                      "(a worker killed mid-write); dropped it, kept the record after it")
            return record

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            data = b"".join(json.dumps(log, separators=(",", ":")).encode() + b"\n"
                            for log in logs)
            self._lock_obj.acquire()
            try:
                with open(path, "r+b") as f:
                    _cut_fragment(f, path)
                    f.seek(0, os.SEEK_END)
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            finally:
                self._lock_obj.release()

    return TornSafeJournal()


def record_of(line: bytes) -> tuple[Optional[dict[str, Any]], bool]:
    """One journal line's record and whether it was spliced: the line itself,
    else the whole record an older writer appended after a torn fragment,
    else ``(None, False)``. The one per-line rule, shared with the WebUI's
    reader (ui/journal.py) so both replay the same records."""
    try:
        return _record(json.loads(line)), False
    except (ValueError, TypeError):
        pass
    spliced = _after_fragment(line)
    return spliced, spliced is not None


def _record(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or "op_code" not in value:
        raise ValueError("not a record")
    return value


def _after_fragment(line: bytes) -> Optional[dict[str, Any]]:
    """The whole record an older writer appended after a torn fragment."""
    at = line.find(_RECORD_START, 1)
    while at > 0:
        try:
            return _record(json.loads(line[at:]))
        except (ValueError, TypeError):
            at = line.find(_RECORD_START, at + 1)
    return None


def _cut_fragment(f: Any, path: str) -> None:
    """Cut an unfinished last line (its writer died holding the lock)."""
    size = end = f.seek(0, os.SEEK_END)
    keep = 0
    while end > 0:
        start = max(end - 65536, 0)
        f.seek(start)
        block = f.read(end - start)
        if end == size and block.endswith(b"\n"):
            return
        nl = block.rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        end = start
    if keep == size:
        return
    f.truncate(keep)
    os.fsync(f.fileno())
    _note(f"study storage {path}: dropped a torn record at its end (a worker killed "
          f"mid-write, {size - keep} bytes at offset {keep})")


def _note(message: str) -> None:
    print(f"det-launch experiment: {message}", file=sys.stderr, flush=True)
