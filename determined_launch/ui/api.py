"""The JSON API's answers (``/api/v1/...``), computed from the files and studies.

Each method returns plain JSON-able data, or None for "no such thing" (the
server's 404). Nothing here writes: the UI is a reader beside the flow.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from determined_launch.common.redact import printable
from determined_launch.exproot import trial_id_of
from determined_launch.ui import files, outcome, shape
from determined_launch.ui.bodies import Bodies, stat_signature
from determined_launch.ui.catalog import Catalog
from determined_launch.ui.run_pages import RunPages
from determined_launch.ui.runs import RemoteCheckpoints, RunReader, Storages
from determined_launch.ui.study import Studies, StudyError
from determined_launch.ui.trial_rows import TrialEntry, TrialRows

FINISHED = ("completed", "stopped (ASHA)", "failed", "invalid hparams")


class Api:
    def __init__(self, paths: Sequence[str], study_storage: Optional[str] = None,
                 remotes: Sequence[tuple[str, RemoteCheckpoints]] = ()) -> None:
        """``remotes``: (local mirror, its object storage) of object-storage PATHs."""
        self.catalog = Catalog(paths)
        self.remotes = [(os.path.abspath(local), storage) for local, storage in remotes]
        self.roots = self.catalog.roots
        self.runs_reader = RunReader(self.roots)
        self.studies = Studies(study_storage, self.roots)
        self.rows = TrialRows(self.runs_reader)
        #: the plain runs' answers, and the run part of every trial's answer
        self.run_pages = RunPages(self.catalog, self.runs_reader, self.remotes)
        self.bodies = Bodies()

    # -- experiments ---------------------------------------------------------------

    def _record(self, exp_dir: str) -> dict[str, Any]:
        return files.read_json(os.path.join(exp_dir, "experiment.json"), self.roots) or {}

    def _study(self, exp_dir: str, record: dict[str, Any]) -> tuple[list[Any], Optional[str]]:
        from determined_launch.experiment import report

        try:
            return report.visible(self.studies.trials(exp_dir, record)), None
        except StudyError as e:
            return [], str(e)

    def experiments(self) -> list[dict[str, Any]]:
        return [self._guarded(name, path) for name, path in self.catalog.experiments().items()]

    def experiment(self, name: str) -> Optional[dict[str, Any]]:
        path = self.catalog.experiments().get(name)
        return None if path is None else self._guarded(name, path)

    def _guarded(self, name: str, exp_dir: str) -> dict[str, Any]:
        """The experiment's summary, or, if one of its files cannot be read as
        one (a hand-edited record, a corrupt study), the reason in one line:
        one bad experiment never empties the home page."""
        try:
            return self._summary(name, exp_dir)
        except Exception as e:  # noqa: BLE001 (any file's fault is that experiment's)
            empty = dict.fromkeys(("searcher", "metric", "best_trial", "start", "end",
                                   "duration", "max_trials", "searcher_config", "storage"))
            return {**empty, "name": name, "state": "unreadable", "path": exp_dir,
                    "smaller_is_better": True, "num_trials": 0, "trial_states": {},
                    "error": shape.redact_text(printable(f"{type(e).__name__}: {e}")[:500])}

    def _summary(self, name: str, exp_dir: str) -> dict[str, Any]:
        from determined_launch.experiment import report

        record = self._record(exp_dir)
        searcher = _section(record, "searcher")
        smaller = bool(searcher.get("smaller_is_better", True))
        # From the study alone, not the trials' rows: the home page's first
        # request after start never waits for 10,000 rows to be made.
        trials, error = self._study(exp_dir, record)
        counts: dict[str, int] = {}
        best: Optional[dict[str, Any]] = None
        starts, ends, now = [], [], time.time()
        for t in trials:
            st = outcome.unless_killed(report.state_of(t, now), exp_dir)
            counts[st] = counts.get(st, 0) + 1
            value = report.best_value(t, smaller) if st != "invalid hparams" else None
            if value is not None and math.isfinite(value) and (
                    best is None or (value < best["value"] if smaller else value > best["value"])):
                best = {"trial_id": trial_id_of(t), "value": value}
            if t.datetime_start is not None:
                starts.append(t.datetime_start.timestamp())
            if t.datetime_complete is not None:
                ends.append(t.datetime_complete.timestamp())
        state = _experiment_state(counts, _count(searcher.get("max_trials"), "max_trials"),
                                  error)
        if state != "running" and outcome.killed(exp_dir):
            state = "canceled"  # killed (det e kill, the page's Kill): never activated again
        end = time.time() if state == "running" else (max(ends) if ends else None)
        start = min(starts) if starts else None
        return shape.finite({
            "name": name, "searcher": searcher.get("name"), "metric": searcher.get("metric"),
            "smaller_is_better": smaller, "state": state, "num_trials": len(trials),
            "trial_states": counts, "best_trial": best, "start": start, "end": end,
            "duration": (end - start) if start is not None and end is not None else None,
            "max_trials": searcher.get("max_trials"), "searcher_config": shape.redact(searcher),
            "storage": shape.redact(record.get("storage")) or "journal file",
            "path": exp_dir, "error": error})

    def warm_up(self) -> None:
        """Read every run's streams and every experiment's study once (the
        server does this at start, beside serving, so the first visitor of a
        million-point run or a 10,000-trial experiment is served from memory)."""
        # Experiments first: the home page (the first a visitor sees) needs every table.
        for name in self.catalog.experiments():
            _quietly(f"experiment {name}", functools.partial(self.curves, name))
        for name, path in self.catalog.runs().items():
            _quietly(f"run {name}", functools.partial(self._read_run, path))
        for name in self.catalog.experiments():  # Optuna's replay: after every table
            _quietly(f"importance {name}", functools.partial(self.importance, name))

    def _read_run(self, path: str) -> None:
        for group in self.runs_reader.groups(path):
            self.runs_reader.table(path, group)

    def importance(self, name: str) -> Optional[dict[str, Any]]:
        exp_dir = self.catalog.experiments().get(name)
        if exp_dir is None:
            return None
        try:
            values = self.studies.importance(exp_dir, self._record(exp_dir))
        except StudyError as e:
            return {"importance": {}, "error": str(e)}
        return {"importance": shape.finite(values), "method": "PED-ANOVA (Optuna)"}

    def _entries(self, name: str) -> Optional[list[TrialEntry]]:
        exp_dir = self.catalog.experiments().get(name)
        if exp_dir is None:
            return None
        return self._entries_at(exp_dir, self._record(exp_dir))[0]

    def _entries_at(self, exp_dir: str, record: dict[str, Any]
                    ) -> tuple[list[TrialEntry], Optional[str]]:
        smaller = bool(_section(record, "searcher").get("smaller_is_better", True))
        trials, error = self._study(exp_dir, record)
        return self.rows.entries(exp_dir, trials, smaller), error

    def trials(self, name: str) -> Optional[list[dict[str, Any]]]:
        entries = self._entries(name)
        return None if entries is None else [e.row for e in entries]

    def trials_body(self, name: str) -> Optional[bytes]:
        """``trials`` as JSON, joined from each finished trial's encoding, made once."""
        entries = self._entries(name)
        return None if entries is None else b"[" + b",".join(e.row_json() for e in entries) + b"]"

    def curves(self, name: str) -> Optional[list[dict[str, Any]]]:
        """The searcher metric against length for every trial (the study's reports)."""
        entries = self._entries(name)
        return None if entries is None else [e.curve for e in entries]

    def curves_body(self, name: str) -> Optional[bytes]:
        entries = self._entries(name)
        return None if entries is None else b"[" + b",".join(e.curve_json() for e in entries) + b"]"

    #: an experiment's answers kept whole while unchanged (bodies.py): URL part -> made by
    PARTS = ("", "trials", "searcher_metric", "importance")

    def experiment_body(self, name: str, part: str) -> Optional[tuple[bytes, str]]:
        """(JSON body, ETag) of the experiment's answer ``part`` (one of
        ``PARTS``; "" is the summary), built again only when its inputs'
        signature changed: an unchanged poll of 10,000 trials is a few stats."""
        exp_dir = self.catalog.experiments().get(name)
        if exp_dir is None:
            return None
        return self.bodies.get((exp_dir, name, part), self._signature(exp_dir),
                               functools.partial(self._build, name, part),
                               urgent=part != "importance")  # the first paint's three

    def _signature(self, exp_dir: str) -> Optional[tuple[Any, ...]]:
        study = self.studies.signature(exp_dir, self._record(exp_dir))
        if study is None:
            return None
        return (stat_signature(os.path.join(exp_dir, "experiment.json")), study,
                outcome.killed(exp_dir), self.rows.filled)

    def _build(self, name: str, part: str) -> Optional[tuple[bytes, bool]]:
        """(body, whether it may be kept): never while something runs (a
        running trial's row and state depend on the clock and its files)."""
        if part in ("", "importance"):
            value = self.experiment(name) if part == "" else self.importance(name)
            if value is None:
                return None
            body = json.dumps(value, separators=(",", ":")).encode()
            return body, part == "importance" or value.get("state") != "running"
        entries = self._entries(name)
        if entries is None:
            return None
        encode = TrialEntry.row_json if part == "trials" else TrialEntry.curve_json
        body = b"[" + b",".join(encode(e) for e in entries) + b"]"
        return body, not any(e.row["state"] == "running" for e in entries)

    def trial_dir(self, name: str, trial_id: int) -> Optional[str]:
        exp_dir = self.catalog.experiments().get(name)
        if exp_dir is None:
            return None
        path = TrialRows.trial_dir_of(exp_dir, trial_id)
        return path if files.confined(path, self.roots) and os.path.isdir(path) else None

    def trial(self, name: str, trial_id: int) -> Optional[dict[str, Any]]:
        """One trial's page: its row, all its hparams, exit and resume history."""
        exp_dir = self.catalog.experiments().get(name)
        run_dir = self.trial_dir(name, trial_id)
        if exp_dir is None or run_dir is None:
            return None
        record = self._record(exp_dir)
        searcher = _section(record, "searcher")
        trials, error = self._study(exp_dir, record)
        found = [t for t in trials if trial_id_of(t) == trial_id]
        row = (self.rows.entry(exp_dir, found[0],
                           bool(searcher.get("smaller_is_better", True))).row
               if found else {"trial_id": trial_id, "state": "unknown", "error": error})
        info = files.read_json(os.path.join(run_dir, "cluster_info.json"), self.roots) or {}
        block = _section(info, "trial")
        out = {**self.run_pages.details(run_dir), **row, "experiment": name,
               "metric": searcher.get("metric"),
               "smaller_is_better": searcher.get("smaller_is_better", True),
               "hparams_all": shape.redact(block.get("hparams")),
               "resumed_from": info.get("latest_checkpoint"), "trial_seed": block.get("trial_seed")}
        if out["state"] == "running":  # a summary line is an earlier attempt's (history)
            out.update(exit_status=None, outcome=None)
        self._truth(out, run_dir)
        del out["_times"]
        return shape.finite(out)

    def _truth(self, out: dict[str, Any], run_dir: str) -> None:
        """What happened to the trial, from its study state and why the driver
        stopped it (``stop_reason.json``), not from the launcher's exit status:
        the driver ends a trial through preemption (ui/outcome.py)."""
        reason = (files.read_json(os.path.join(run_dir, "stop_reason.json"), self.roots)
                  or {}).get("reason")
        reason = reason if isinstance(reason, str) else None
        out.update(outcome.trial_ended(out["state"], out.get("length"), reason,
                                       out.get("exit_status"), out.get("outcome")))
        logged = self.runs_reader.output.modified(run_dir)
        out["history"] = outcome.history(out["launcher_events"], out["_times"], out["state"],
                                         reason, out.get("length"), logged)
        if out["state"] == "failed":
            out["output_tail"] = self.runs_reader.output.tail(run_dir)

    def experiment_storage(self, name: str) -> Storages:
        exp_dir = self.catalog.experiments().get(name)
        if exp_dir is None:
            return []
        return self.run_pages.storages(exp_dir, os.path.join(exp_dir, "checkpoints"))



def _quietly(what: str, work: Callable[[], Any]) -> None:
    """Warm-up work: an error is one line here (the page shows it again, as a 500)."""
    try:
        work()
    except Exception as e:  # noqa: BLE001
        print(f"det-launch ui: {printable(what)}: {type(e).__name__}: {printable(e)}",
              file=sys.stderr, flush=True)


def _count(value: Any, name: str) -> int:
    """A count from ``experiment.json``: an int, or the file is not one we wrote."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"experiment.json: searcher.{name} is {value!r:.40}, not an integer")
    return value


def _section(record: dict[str, Any], key: str) -> dict[str, Any]:
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def _experiment_state(counts: dict[str, int], max_trials: int, error: Optional[str]) -> str:
    if error:
        return "unknown"
    if counts.get("running"):
        return "running"
    if counts.get("paused"):
        return "paused"  # its trials wait for the experiment's command to be rerun
    done = sum(n for s, n in counts.items() if s in FINISHED and s != "invalid hparams")
    if not counts:
        return "pending"
    if max_trials and done >= max_trials:
        return "failed" if done == counts.get("failed", 0) else "completed"
    return "stopped"
