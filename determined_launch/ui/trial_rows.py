"""The experiment page's trial rows and curves, made once per finished trial.

With 10,000 trials a poll must not reread 10,000 trials' files: a finished
trial's row and curve never change, so they are computed once and kept (with
their JSON encoding), and its file column (checkpoints) is filled
in by one background thread, so the table is served at once from the study.
A running trial's row is computed on every request.
"""

from __future__ import annotations

import json
import math
import os
import queue
import sys
import threading
import time
from typing import Any, Optional

from determined_launch.common.redact import printable, secret_key
from determined_launch.exproot import trial_id_of
from determined_launch.ui import outcome, shape
from determined_launch.ui.bodies import FOREGROUND
from determined_launch.ui.runs import RunReader

#: the filler's progress is published (``TrialRows.filled``, part of the answers'
#: signature) at most this often while rows remain: each change rebuilds a 3 MB answer
PUBLISH_S = 2.0
#: the filler lets pages' answers go first at most once per this much of its own
#: work (so polls that never pause slow it to a few %, never stop it)
YIELD_EVERY_S = 0.1


def _num(v: Any) -> Any:
    """``shape.finite`` of one value, floats inline: 10,000 rows have 60,000 of them."""
    if type(v) is float:
        return v if math.isfinite(v) else None
    return v if v is None or type(v) is int else shape.finite(v)


_PLAIN = frozenset({int, float, bool, type(None)})


def _hparams(hp: dict[str, Any]) -> dict[str, Any]:
    """``shape.finite(shape.redact(hp))``; numbers under keys that are not secret
    (a search's usual hparams) without the general walk: 10,000 rows of them."""
    if all(type(v) in _PLAIN for v in hp.values()) and not any(
            secret_key(str(k)) for k in hp):
        return {str(k): _num(v) for k, v in hp.items()}
    return shape.finite(shape.redact(hp))


def _ts(dt: Any) -> Optional[float]:
    return dt.timestamp() if dt is not None else None


def _trial_state(t: Any, exp_dir: str) -> str:
    from determined_launch.experiment import report

    return outcome.unless_killed(str(report.state_of(t)), exp_dir)


#: one encoder for every row (``json.dumps`` with options builds one per call)
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


class TrialEntry:
    """One trial's row and curve, with their JSON encoded on first use."""

    __slots__ = ("end", "row", "curve", "_row_json", "_curve_json")

    def __init__(self, end: Optional[float], row: dict[str, Any],
                 curve: dict[str, Any]) -> None:
        self.end, self.row, self.curve = end, row, curve
        self._row_json: Optional[tuple[dict[str, Any], bytes]] = None
        self._curve_json: Optional[bytes] = None

    def row_json(self) -> bytes:
        row = self.row  # replaced whole when its file columns arrive (TrialRows._fill)
        cached = self._row_json
        if cached is None or cached[0] is not row:
            cached = self._row_json = (row, _ENCODE(row).encode())
        return cached[1]

    def curve_json(self) -> bytes:
        if self._curve_json is None:
            self._curve_json = _ENCODE(self.curve).encode()
        return self._curve_json


class TrialRows:
    """The cache of finished trials' rows and curves, and the thread that
    fills in their file columns."""

    def __init__(self, runs_reader: RunReader) -> None:
        self.runs_reader = runs_reader
        #: finished trials, which never change: (exp_dir, number) -> row and curve
        self._final: dict[tuple[str, int], TrialEntry] = {}
        self._lock = threading.Lock()
        self._exp_locks: dict[str, threading.Lock] = {}
        self._pending: queue.SimpleQueue[TrialEntry] = queue.SimpleQueue()
        self._filler: Optional[threading.Thread] = None
        #: rows filled in so far, published in steps (a kept answer made before a
        #: fill is stale, bodies.py): every PUBLISH_S, and when none are left
        self.filled = 0
        self._done = 0

    def entries(self, exp_dir: str, trials: list[Any], smaller: bool) -> list[TrialEntry]:
        with self._lock:
            lock = self._exp_locks.setdefault(exp_dir, threading.Lock())
        with lock:  # the first reader of 10,000 trials' files does it once for all
            return [self.entry(exp_dir, t, smaller) for t in trials]

    def entry(self, exp_dir: str, t: Any, smaller: bool) -> TrialEntry:
        """A trial's row and curve. A finished trial's are made once: with
        10,000 trials a poll then costs the running trials' files only."""
        key = (exp_dir, t.number)
        end = _ts(t.datetime_complete)
        cached = self._final.get(key)
        if cached is not None and cached.end == end:
            return cached
        finished = end is not None and t.state.name != "RUNNING"
        row = self._compute_row(exp_dir, t, smaller, files=not finished)
        entry = TrialEntry(end, row, {"trial_id": row["trial_id"], "state": row["state"],
                                  "points": [[k, _num(v)] for k, v in
                                             sorted(t.intermediate_values.items())]})
        if finished:
            self._final[key] = entry
            self._pending.put(entry)
            self._start_filler()
        return entry

    def _start_filler(self) -> None:
        """A finished trial's file column (checkpoints) is read by
        one background thread: a 10,000-trial table is served at once from the
        study, and its columns fill in within seconds (the pages are live)."""
        with self._lock:
            if self._filler is None:
                self._filler = threading.Thread(target=self._fill, daemon=True,
                                                name="trial-files")
                self._filler.start()

    def _fill(self) -> None:
        published, checked = time.monotonic(), 0.0  # the first row waits
        while True:
            entry = self._pending.get()
            if time.monotonic() - checked > YIELD_EVERY_S:  # after the answers a page waits for
                FOREGROUND.wait_quiet(limit=2.0)
                checked = time.monotonic()
            try:
                columns = self._file_columns(entry.row["path"])
            except Exception as e:  # noqa: BLE001 (one unreadable trial leaves a gap, not a dead thread)
                print(f"det-launch ui: {printable(entry.row['path'])}: {type(e).__name__}: "
                      f"{printable(e)}", file=sys.stderr, flush=True)
                columns = None
            if columns is not None:
                entry.row = {**entry.row, **columns}  # counts: finite
                self._done += 1
            if self._pending.empty() or time.monotonic() - published > PUBLISH_S:
                self.filled, published = self._done, time.monotonic()

    def _file_columns(self, run_dir: str) -> dict[str, Any]:
        return {"checkpoints": sum(1 for c in self.runs_reader.table(run_dir, "checkpoints")
                                   .records if c.get("storage_id"))}

    def _compute_row(self, exp_dir: str, t: Any, smaller: bool,
                     files: bool = True) -> dict[str, Any]:
        from determined_launch.experiment import report

        values = t.intermediate_values
        length = max(values) if values else None
        trial_id = trial_id_of(t)
        error = t.user_attrs.get("det_error")
        row: dict[str, Any] = {
            "trial_id": trial_id, "state": _trial_state(t, exp_dir),
            # Optuna's own number (optuna-dashboard's "Trial N"): ids are root-wide
            "optuna_number": int(t.number),
            "hparams": _hparams(report.hparams_of(t)),
            "best_value": _num(report.best_value(t, smaller)),
            "latest_value": _num(values[length]) if length is not None else None,
            "length": length, "start": _ts(t.datetime_start), "end": _ts(t.datetime_complete),
            "error": None if error is None else _num(shape.redact(error)),
            # failures restarted by the driver (the study's count, as Determined's)
            "restarts": int(t.user_attrs.get("det_restarts", 0) or 0)}
        row["path"] = self.trial_dir_of(exp_dir, trial_id)
        row.update(self._file_columns(row["path"]) if files else
                   {"checkpoints": None})
        return row  # every value finite already (no second walk of 10,000 rows)

    @staticmethod
    def trial_dir_of(exp_dir: str, trial_id: int) -> str:
        return os.path.join(exp_dir, "trials", str(int(trial_id)))
