"""What Determined's ``TrainContext`` asks its master for, kept in the run directory.

Off-cluster there is no master, so each call does the closest useful local thing:

* ``set_status(s)``: an INFO log line and ``<run_dir>/status.json``.
* ``set_metadata(d)`` / ``get_metadata()``: ``<run_dir>/run_metadata.json``
  (``{}`` before the first ``set_metadata``).
* ``report_early_exit(reason)``: an INFO log line and ``<run_dir>/early_exit.json``,
  which ``det-launch experiment`` reads (an ``INVALID_HP`` trial is not a failure).
* ``get_experiment_best_validation()``: ``None`` ("no best yet"): the
  experiment-wide best lives in the searcher, not in one trial's run directory.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from typing import Any, Optional

from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir, dumps

logger = logging.getLogger("determined_launch.core")

STATUS_POINTER = "status"
METADATA_POINTER = "run_metadata"
EARLY_EXIT_POINTER = "early_exit"


class EarlyExitReason(enum.Enum):
    """Why a trial stopped before its searcher length (Determined's values)."""

    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class LocalTrainCalls:
    """The master-backed ``TrainContext`` calls, for ``TrainContext`` to inherit."""

    _dist: Collectives
    _run_dir: RunDir

    def set_status(self, status: str) -> None:
        """A short note on what the trial is doing (Determined shows it in its web UI)."""
        logger.info("status: %s", status)
        self._run_dir.write_pointer(STATUS_POINTER, {"status": str(status)})

    def set_metadata(self, metadata: Mapping[str, Any]) -> Optional[dict[str, Any]]:
        """Replace this run's metadata (a JSON object); returns what was stored."""
        if not isinstance(metadata, Mapping):
            raise TypeError(f"set_metadata() takes a dict, got {type(metadata).__name__}")
        dumps(dict(metadata))  # unserializable values fail here, not at read time
        self._run_dir.write_pointer(METADATA_POINTER, {"metadata": dict(metadata)})
        return dict(metadata)

    def get_metadata(self) -> Optional[dict[str, Any]]:
        """This run's metadata, ``{}`` until ``set_metadata`` is called."""
        pointer = self._run_dir.read_pointer(METADATA_POINTER)
        value = pointer.get("metadata") if pointer else None
        return dict(value) if isinstance(value, dict) else {}

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """Record why the trial stops early; ``core.Context`` reports
        ``INVALID_HP`` itself when ``det.InvalidHP`` leaves its block."""
        reason = EarlyExitReason(reason)
        logger.info("report_early_exit(%s)", reason)
        self._run_dir.write_pointer(EARLY_EXIT_POINTER, {"reason": reason.value})

    def get_experiment_best_validation(self) -> Optional[float]:
        """``None``: no master, so no experiment-wide best (see the module doc)."""
        return None
