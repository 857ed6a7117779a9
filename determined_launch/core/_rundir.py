"""The run directory: where the local Core API keeps what a master would.

Off-cluster there is no master to receive metrics or remember the latest
checkpoint, so ``core.init`` keeps them in one directory per run::

    <run_dir>/training.jsonl      report_training_metrics, one JSON object per line
    <run_dir>/validation.jsonl    report_validation_metrics
    <run_dir>/<group>.jsonl       report_metrics(group, ...)
    <run_dir>/progress.jsonl      report_progress / op.report_progress
    <run_dir>/searcher.jsonl      op.report_completed
    <run_dir>/latest_checkpoint.json   the newest committed checkpoint (for resuming)
    <run_dir>/checkpoints.jsonl        every checkpoint the run committed

Only the chief writes here, so lines never interleave between ranks. The
layout, the run's identity and the resume rule are ``determined_launch/rundir.py``'s.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Optional

from determined_launch import rundir
from determined_launch.core._dist import Collectives
from determined_launch.rundir import write_atomically


def require_chief(dist: Collectives, what: str) -> None:
    """Reporting is the chief's job, as in Determined: duplicates from every
    rank would corrupt the metric history, so other ranks fail loudly."""
    if dist.rank != 0:
        raise RuntimeError(
            f"{what} may only be called on the chief (rank 0), but was called on "
            f"rank {dist.rank}; guard it with `if core_context.distributed.rank == 0:`"
        )


def _to_jsonable(obj: Any) -> Any:
    """``json.dumps`` fallback for numpy and torch scalars and arrays. Called for
    every numpy value of a report (the Trainer's 100 batch metrics): a try is
    half the cost of a ``hasattr`` first (BENCHMARKS.md, Trainer overhead)."""
    try:
        return obj.tolist()
    except AttributeError:
        pass
    try:
        return obj.item()
    except AttributeError:
        raise TypeError(
            f"metric value of type {type(obj).__name__} is not JSON-serializable") from None


def dumps(record: Any) -> str:
    # NaN and inf are written as JSON extensions (Python's json reads them);
    # a diverging loss is a metric worth keeping, not an error.
    return json.dumps(record, default=_to_jsonable, sort_keys=True)


#: pointer (``stop_reason.json``) that ``det-launch experiment``'s driver writes in a
#: trial's run directory before it asks the trial to stop: ``{"reason": "pruned" | "done" |
#: "error" | "driver"}``, so the trial's trackers end its run with the right state
STOP_REASON = "stop_reason"


class RunDir:
    """Append-only JSON-lines streams plus small pointer files in one directory."""

    def __init__(self, path: pathlib.Path, *, trial_id: Optional[int],
                 hparams: Optional[Mapping[str, Any]] = None,
                 command: Optional[str] = None,
                 owner: Optional[tuple[str, ...]] = None) -> None:
        self.path = path
        self.trial_id = trial_id
        #: the trial's hyperparameters, recorded with each checkpoint so that a
        #: rerun resumes only the same trial (cluster/local_trial.py)
        self.hparams = dict(hparams) if hparams is not None else None
        #: the key of the command that owns the run (rundir.command_key), recorded
        #: with each checkpoint so that only the same command resumes it
        self.command = command
        #: the command to record as the run's owner when this creates the directory
        self._owner = owner
        #: called after every write (the chief's sync to object storage, core/_record_sync.py)
        self.on_write: Optional[Callable[[], None]] = None
        #: stream -> its file, opened once in append mode: an open and close per
        #: line cost 80 µs, a tenth of a Trainer report (BENCHMARKS.md)
        self._fds: dict[str, int] = {}
        self._fds_lock = threading.Lock()
        weakref.finalize(self, _close_all, self._fds)

    @property
    def identity(self) -> rundir.Identity:
        """Which checkpoint records are this run's (``rundir.Identity``)."""
        return rundir.Identity(self.trial_id, self.trial_id in (None, 0), self.hparams,
                               self.command)

    def append(self, stream: str, record: Mapping[str, Any]) -> None:
        """Append one record with a timestamp. One ``write`` per line to a file
        opened with ``O_APPEND``, so a crash never leaves half a line and lines
        of two threads never mix."""
        line = (dumps({"time": round(time.time(), 6), "trial_id": self.trial_id, **record})
                + "\n").encode("utf-8")
        fd = self._fds.get(stream)
        if fd is None:
            fd = self._open(stream)
        while line:  # a regular file takes it in one write; a short one continues
            line = line[os.write(fd, line):]
        if self.on_write is not None:
            self.on_write()

    def _mkdir(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if self._owner is not None:  # the first write of a run without a launcher
            owner, self._owner = self._owner, None
            if rundir.read_command(self.path) is None:
                rundir.record_command(self.path, owner)

    def _open(self, stream: str) -> int:
        with self._fds_lock:
            if stream not in self._fds:
                self._mkdir()
                self._fds[stream] = os.open(
                    self.path / f"{stream}.jsonl",
                    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            return self._fds[stream]

    def close(self) -> None:
        """Close the streams' files now rather than at garbage collection (a later
        ``append`` opens its stream again)."""
        with self._fds_lock:
            _close_all(self._fds)

    def write_pointer(self, name: str, value: Mapping[str, Any]) -> None:
        self._mkdir()
        write_atomically(self.path / f"{name}.json", dumps(dict(value)) + "\n")
        if self.on_write is not None:
            self.on_write()

    def read_pointer(self, name: str) -> Optional[dict[str, Any]]:
        try:
            with open(self.path / f"{name}.json", encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as e:
            raise RuntimeError(
                f"run directory file {self.path / name}.json is unreadable: {e}"
            ) from e
        return data if isinstance(data, dict) else None


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def read_jsonl(path: os.PathLike[str] | str) -> list[dict[str, Any]]:
    """Read a stream written by ``RunDir.append`` (for tests and analysis)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out
