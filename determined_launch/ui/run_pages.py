"""The plain runs' answers (``/api/v1/runs/...``), and the part of a trial's
answer that every run directory has (its notes, log, history, restarts).

A run's state comes from its launcher's record of how the job ended
(``rundir.EXIT_FILE``) when there is one, else from how recently it reported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Optional

from determined_launch.common.redact import printable
from determined_launch.rundir import EXIT_FILE
from determined_launch.ui import files, outcome, shape
from determined_launch.ui.catalog import Catalog
from determined_launch.ui.runs import RemoteCheckpoints, RunReader, Storages

#: a plain run that reported within this many seconds is shown as active
ACTIVE = 60.0


class RunPages:
    def __init__(self, catalog: Catalog, reader: RunReader,
                 remotes: Sequence[tuple[str, RemoteCheckpoints]]) -> None:
        """``remotes``: (local mirror, its object storage) of object-storage PATHs."""
        self.catalog = catalog
        self.roots = catalog.roots
        self.runs_reader = reader
        self.remotes = remotes

    def storages(self, path: str, local: str) -> Storages:
        """A mirrored tree's checkpoints are in its object storage, else beside it."""
        for root, storage in self.remotes:
            if path == root or path.startswith(root + os.sep):
                return [storage]
        return [local]

    def run_dir(self, name: str) -> Optional[str]:
        return self.catalog.runs().get(name)

    def runs(self) -> list[dict[str, Any]]:
        out = []
        for name, path in self.catalog.runs().items():
            try:
                out.append(self.summary(name, path, self._exit(path)))
            except Exception as e:  # noqa: BLE001 (one bad run never empties the list)
                out.append({"name": name, "path": path, "state": "unreadable",
                            "error": printable(f"{type(e).__name__}: {e}")[:500]})
        return out

    def summary(self, name: str, path: str, ended: Optional[dict[str, Any]]) -> dict[str, Any]:
        """The run's row; ``ended``: its launcher's exit record (``_exit``), if any."""
        start, last = self.runs_reader.activity(path)
        active = last is not None and time.time() - last < ACTIVE
        state = "active" if active else "idle"
        if ended is not None:  # the launcher's record of how its job ended (rundir.EXIT_FILE)
            state = outcome.run_state(ended["exit_status"])
            last = max(last or 0.0, ended["time"]) or None
        return shape.finite({"name": name, "path": path, "start": start, "last_update": last,
                             "state": state, "steps_completed": self.runs_reader.last_step(path)})

    def _exit(self, path: str) -> Optional[dict[str, Any]]:
        record = files.read_json(os.path.join(path, EXIT_FILE), self.roots) or {}
        status, when = record.get("exit_status"), record.get("time")
        if isinstance(status, bool) or not isinstance(status, int) or not isinstance(
                when, (int, float)) or isinstance(when, bool):
            return None
        return {"exit_status": status, "time": float(when)}

    def run(self, name: str) -> Optional[dict[str, Any]]:
        path = self.run_dir(name)
        if path is None:
            return None
        ended = self._exit(path)
        out = {**self.summary(name, path, ended), **self.details(path)}
        if ended is not None:
            if out["exit_status"] is None:
                out["exit_status"] = ended["exit_status"]
            out["ended"] = outcome.run_ended(ended["exit_status"])
            out["history"] = outcome.history(out["launcher_events"], out["_times"],
                                             out["state"], None, None, ended["time"])
            if out["state"] == "errored":
                out["output_tail"] = self.runs_reader.output.tail(path)
        del out["_times"]
        return shape.finite(out)

    def run_storage(self, name: str) -> Storages:
        path = self.run_dir(name)
        return self.storages(path, os.path.join(os.path.dirname(path), "checkpoints")) \
            if path else []

    def details(self, run_dir: str) -> dict[str, Any]:
        r = self.runs_reader
        events, times = r.output.launcher_timed(run_dir)
        return {**r.status(run_dir), **r.output.outcome(events), "groups": r.groups(run_dir),
                "launcher_events": events, "_times": times,
                "log_ranks": r.output.log_ranks(run_dir),
                "stragglers": r.stragglers(run_dir),
                "history": outcome.history(events, times, "running", None, None, None),
                "ended": None, "output_tail": None,
                "restarts": r.regressions(run_dir), "steps_completed": r.last_step(run_dir)}
