"""The run directory's records in object storage, so that ``det-launch ui
s3://bucket/prefix`` shows runs whose files are not on the reader's machine.

With object-storage checkpoints the chief also copies its run directory's
record files (every ``*.jsonl`` stream and the pointer files ``status.json``,
``early_exit.json``, ``run_metadata.json``, ``latest_checkpoint.json``) to
``<storage>/runs/<run name>/``, beside ``<storage>/tensorboard/<run name>/``.
Not copied: checkpoints (already there), ``cluster_info.json`` (it may hold the
job secret), logs (the launcher writes them, not the worker; an experiment's
driver copies its trials' ``output.log``: experiment/sync.py).

When: after a record is written, at most once a second (longer when an upload
takes longer: at most a fifth of the time is spent uploading), in a background
thread, so training never waits for storage; and once more at exit. A file is
uploaded whole when it changed: one object PUT each, so a reader sees the old
or the new file, never a torn one (a stream's last line may still be partial;
readers wait for its newline). A failure is one warning; the next sync retries.
"""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Optional

logger = logging.getLogger("determined_launch.core")

#: Directory under the storage root holding every run's record files.
STORAGE_DIR = "runs"
POINTERS = frozenset({"status.json", "early_exit.json", "run_metadata.json",
                      "latest_checkpoint.json"})
_INTERVAL = 1.0
_CLOSE_WAIT = 60.0  # an upload in flight at exit, before the last sync


def storage_run_name(run_dir: pathlib.Path) -> str:
    """The run's name in storage: its directory's name, and for a trial of an
    experiment (``<experiment>/trials/<id>``) ``<experiment>.trial-<id>``, so
    that the trials of two experiments in one storage do not collide."""
    if run_dir.parent.name == "trials" and run_dir.name.isdigit():
        return f"{run_dir.parent.parent.name}.trial-{run_dir.name}"
    return run_dir.name


def is_record(name: str) -> bool:
    return (name.endswith(".jsonl") and not name.startswith(".")) or name in POINTERS


class RecordSync:
    """Uploads the run directory's changed record files; chief only."""

    def __init__(self, run_dir: pathlib.Path,
                 upload: Callable[[str, pathlib.Path], None]) -> None:
        self.run_dir = run_dir
        self._upload = upload
        self._synced: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()  # one sync at a time
        self._thread: Optional[threading.Thread] = None
        self._next = 0.0
        self._closed = False
        self._warned = False

    def poke(self) -> None:
        """A record was written: sync soon, in the background (after
        ``close``, now: an early exit is recorded after the context closed)."""
        if self._closed:
            self._sync_quietly()
            return
        if time.monotonic() < self._next or (self._thread is not None
                                             and self._thread.is_alive()):
            return
        self._thread = threading.Thread(target=self._sync_quietly, daemon=True,
                                        name="det-record-sync")
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._thread.join(_CLOSE_WAIT)
        self._sync_quietly()

    def _sync_quietly(self) -> None:
        with self._lock:
            start = time.monotonic()
            try:
                self.sync()
            except Exception as e:  # records in storage never stop training
                if not self._warned:
                    logger.warning("syncing the run's records to storage failed (retried at "
                                   "the next report): %s: %s", type(e).__name__, e)
                    self._warned = True
            took = time.monotonic() - start
            self._next = time.monotonic() + max(_INTERVAL, 4 * took)

    def sync(self) -> list[str]:
        """Upload record files new or changed since the last sync; their names."""
        sent: list[str] = []
        try:
            paths = sorted(self.run_dir.iterdir())
        except FileNotFoundError:
            return sent
        for path in paths:
            if not is_record(path.name) or not path.is_file():
                continue
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            if self._synced.get(path.name) == stamp:
                continue
            self._upload(path.name, path)
            self._synced[path.name] = stamp
            sent.append(path.name)
        return sent
