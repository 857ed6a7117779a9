"""The experiment's own files in object storage, so that ``det-launch ui
s3://bucket/prefix`` shows the experiment page, not only its trials' runs.

With object-storage checkpoints the driver copies to the checkpoint storage:

* ``experiments/<dir>/study.journal``: the study (a journal file; a database
  study is read from the database, so only its label is copied), cut at its
  last whole line;
* ``experiments/<dir>/experiment.json``: the record the UI needs to read the
  study, written *after* the journal: it is the commit, so a crash before it
  leaves nothing that looks like an experiment;
* ``runs/<dir>.trial-<id>/output.log``: each trial's rank-prefixed output,
  beside the records its chief syncs there (core/_record_sync.py).

``<dir>`` is the experiment directory's name, as in the trials' run names.
When: the journal at every state change (a trial started, completed,
stopped, failed, preempted) and every ``JOURNAL_PERIOD`` seconds while it
changes (the running trials' curves and heartbeats), never per report; the
logs of running trials every ``LOG_PERIOD`` seconds; everything once more
at the end. Each file is one object PUT (a reader sees the old or the new
one); uploads run in a background thread, so the search never waits for
storage, and take at most about a fifth of the time (a slow upload spaces the
next ones). A failure is one warning; the next sync retries.
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import BinaryIO, Optional

from determined_launch.core._record_sync import STORAGE_DIR as RUNS_DIR
from determined_launch.core._record_sync import storage_run_name
from determined_launch.rundir import OUTPUT_FILE

logger = logging.getLogger("determined_launch.experiment")

#: directory under the storage root holding every experiment's own files
STORAGE_DIR = "experiments"
RECORD = "experiment.json"
JOURNAL = "study.journal"
LOG = OUTPUT_FILE
#: seconds between uploads of running trials' logs (when they grew)
LOG_PERIOD = 10.0
#: seconds between uploads of a changed journal without a state change (heartbeats are
#: written every 10 s and a trial whose last beat is 60 s old reads as abandoned)
JOURNAL_PERIOD = 20.0
_MIN_GAP = 1.0  # state changes in a burst share an upload
_CLOSE_WAIT = 120.0

Upload = Callable[[str, pathlib.Path], None]


class ExperimentSync:
    """Uploads an experiment's record, journal and trial logs; one per driver."""

    def __init__(self, exp_dir: pathlib.Path, journal: Optional[pathlib.Path],
                 upload: Upload) -> None:
        self.exp_dir = exp_dir
        self.journal = journal  # None: the study is in a database
        self.prefix = f"{STORAGE_DIR}/{exp_dir.name}"
        self._upload = upload
        self._stamps: dict[str, tuple[int, int]] = {}
        self._trials: dict[int, pathlib.Path] = {}  # every trial directory this driver ran
        self._running: set[int] = set()
        self._ended: set[int] = set()
        self._lock = threading.Lock()  # one sync at a time
        self._state = threading.Lock()  # the trial sets, shared with the search loop
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._committed = False
        self._warned = False
        self._tmp: Optional[pathlib.Path] = None  # the copies' private directory

    # -- what the driver says --------------------------------------------------------

    def start(self) -> None:
        """The thread: its first upload (the journal, then the record) at once."""
        self._thread = threading.Thread(target=self._follow, daemon=True,
                                        name="det-experiment-sync")
        self._thread.start()

    def changed(self) -> None:
        """A trial changed state: sync soon (cheap: called from the search loop)."""
        self._wake.set()

    def running(self, trials: Iterable[tuple[int, pathlib.Path]]) -> None:
        """The trials running now (trial id, directory); called every loop."""
        now = dict(trials)
        if now.keys() == self._running:
            return  # the usual loop: nothing started or ended
        with self._state:
            for tid, path in now.items():
                self._trials.setdefault(tid, path)
            self._ended |= self._running - now.keys()  # their last upload is due (whole now)
            self._running = set(now)

    def close(self) -> None:
        """Everything once more (the final states and whole logs), then stop."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(_CLOSE_WAIT)
        self._sync_quietly(journal=True, logs=True, every_log=True)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _scratch(self, name: str) -> pathlib.Path:
        """Where a copy to upload is made (made on first use: 0700, removed at close)."""
        if self._tmp is None:
            self._tmp = pathlib.Path(tempfile.mkdtemp(prefix="det-exp-sync-"))
        return self._tmp / name

    # -- the thread ------------------------------------------------------------------

    def _follow(self) -> None:
        self._sync_quietly(journal=True, logs=False)
        last_journal = last_logs = time.monotonic()
        while not self._stop.is_set():
            urgent = self._wake.wait(LOG_PERIOD)
            if self._stop.is_set():
                return
            self._wake.clear()
            now = time.monotonic()
            journal = urgent or now - last_journal >= JOURNAL_PERIOD
            logs = urgent or now - last_logs >= LOG_PERIOD  # an ended trial's log is whole
            took = self._sync_quietly(journal=journal, logs=logs)
            last_journal = now if journal else last_journal
            last_logs = now if logs else last_logs
            self._stop.wait(max(_MIN_GAP, 4 * took))  # at most ~1/5 of the time uploading

    def _sync_quietly(self, journal: bool, logs: bool, every_log: bool = False) -> float:
        with self._lock:
            start = time.monotonic()
            try:
                self.sync(journal, logs, every_log)
            except Exception as e:  # the experiment's view in storage never stops the search
                if not self._warned:
                    logger.warning("syncing the experiment to storage failed (retried later): "
                                   "%s: %s", type(e).__name__, e)
                    self._warned = True
            return time.monotonic() - start

    def sync(self, journal: bool = True, logs: bool = True, every_log: bool = True) -> list[str]:
        """Upload what changed; the object names sent. Logs: of the running
        trials and those that ended since; ``every_log``: of every trial this
        driver ran (the end)."""
        sent: list[str] = []
        if journal or not self._committed:
            if self.journal is not None:
                self._put_whole_lines(f"{self.prefix}/{JOURNAL}", self.journal, sent)
            if not self._committed:  # the commit: after the study it points to
                self._put_record(sent)
                self._committed = True
        if logs:
            with self._state:
                ids = list(self._trials) if every_log else sorted(self._running | self._ended)
                self._ended = set()
            for tid in ids:
                path = self._trials[tid] / LOG
                name = f"{RUNS_DIR}/{storage_run_name(self._trials[tid])}/{LOG}"
                stamp = self._changed(name, path)
                if stamp is not None:
                    self._put(name, path, sent, stamp)
        return sent

    def _changed(self, name: str, path: pathlib.Path) -> Optional[tuple[int, int]]:
        """The file's stamp if it changed since its last upload, else None."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        stamp = (st.st_size, st.st_mtime_ns)
        return None if self._stamps.get(name) == stamp else stamp

    def _put(self, name: str, path: pathlib.Path, sent: list[str],
             stamp: tuple[int, int]) -> None:
        self._upload(name, path)
        self._stamps[name] = stamp
        sent.append(name)

    def _put_whole_lines(self, name: str, path: pathlib.Path, sent: list[str]) -> None:
        """The journal up to its last newline: a line being written waits."""
        stamp = self._changed(name, path)
        if stamp is None:
            return
        copy = self._scratch(path.name)
        with open(path, "rb") as src, open(copy, "wb") as dst:
            left = _last_newline(src)
            src.seek(0)
            while left > 0:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    break
                dst.write(chunk)
                left -= len(chunk)
        self._put(name, copy, sent, stamp)

    def _put_record(self, sent: list[str]) -> None:
        """``experiment.json`` as the UI reads it from storage: a journal study
        is the copy beside it (``storage: null``), wherever it was locally."""
        record = json.loads((self.exp_dir / RECORD).read_text(encoding="utf-8"))
        if self.journal is not None:
            record["storage"] = None
        copy = self._scratch(RECORD)
        copy.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        self._upload(f"{self.prefix}/{RECORD}", copy)
        sent.append(f"{self.prefix}/{RECORD}")


def _last_newline(f: BinaryIO) -> int:
    """The offset after the file's last newline (0 if none), reading back from the end."""
    end = f.seek(0, 2)
    pos = end
    while pos > 0:
        step = min(pos, 1 << 16)
        f.seek(pos - step)
        chunk = f.read(step)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return pos - step + at + 1
        pos -= step
    return 0
