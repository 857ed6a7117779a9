"""Experiment trackers: what the chief reports, also sent to MLflow and W&B.

``--report-to mlflow,wandb`` (``DET_REPORT_TO``) makes the chief's
``core.init`` open one ``Sink`` per tool (``_sink.py``): each report is an
append to a bounded queue on the training thread, and a background thread
delivers it, so a tracker never stops or slows training (docs/trackers.md).

One tracker run per trial for the trial's whole life: the run ids live in
``<run_dir>/trackers.json`` with the highest step each group delivered, and
a run that resumes from a checkpoint continues the same tracker run and
skips the steps an earlier life already delivered. A run that starts from
scratch (no checkpoint to resume) starts a new tracker run.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import json
import logging
import pathlib
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from determined_launch import envvars, values
from determined_launch._user import InvalidHP
from determined_launch.core._rundir import write_atomically
from determined_launch.core.trackers._sink import Backend, Sink
from determined_launch.errors import LaunchError

logger = logging.getLogger("determined_launch.core")

__all__ = ["STATES", "RunIdentity", "Trackers", "check_trackers", "end_abandoned",
           "final_state", "flatten", "from_env", "identity", "open_trackers"]

#: The run directory's record of this run's tracker runs.
STATE_FILE = "trackers.json"
#: Seconds ``close`` waits for all trackers to deliver what is queued.
FLUSH_SECONDS = 15.0
#: tool -> (module it needs, the extra that installs it)
PACKAGES = {"mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb"),
            "tensorboard": ("tensorboard", "tensorboard")}
#: A trial's final states, as the trackers' run status shows them.
STATES = ("completed", "stopped (ASHA)", "preempted", "invalid", "errored")


def _missing(names: Sequence[str]) -> list[str]:
    out = []
    for name in names:
        module, extra = PACKAGES.get(name, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            out.append(f"--report-to {name} needs the {module} package: "
                       f"pip install 'determined_launch[{extra}]'")
    return out


def check_trackers(names: Sequence[str]) -> None:
    """The launcher's early check: a missing package is one line (exit status 2)."""
    missing = _missing(names)
    if missing:
        raise LaunchError("; ".join(missing))


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """What a tracker run is named and tagged with."""

    experiment: Optional[str]
    run_name: str
    trial_id: Optional[int]
    hparams: Mapping[str, Any]
    run_dir: pathlib.Path

    def tags(self) -> dict[str, str]:
        out = {"det.run_dir": str(self.run_dir)}
        if self.trial_id is not None:
            out["det.trial_id"] = str(self.trial_id)
        if self.experiment is not None:
            out["det.experiment"] = self.experiment
        return out


def identity(run_dir: pathlib.Path, trial_id: Optional[int],
             hparams: Optional[Mapping[str, Any]]) -> RunIdentity:
    """A ``det-launch experiment`` trial (``<exp_dir>/trials/<id>``, beside the
    experiment's ``experiment.json``) is ``<experiment>/trial-<id>`` in the
    experiment's name; any other run is its run directory's name."""
    experiment: Optional[str] = None
    if run_dir.parent.name == "trials":
        try:
            record = json.loads((run_dir.parent.parent / "experiment.json").read_text("utf-8"))
            experiment = str(record["name"]) if isinstance(record, dict) else None
        except (OSError, ValueError, KeyError):
            experiment = run_dir.parent.parent.name
    name = f"{experiment}/trial-{trial_id}" if experiment is not None else run_dir.name
    return RunIdentity(experiment, name, trial_id, dict(hparams or {}), run_dir)


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested hyperparameters as ``a.b`` keys (MLflow params, TensorBoard HParams)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class _State:
    """``trackers.json``: ``{tool: {"run_id": ..., "seen": {group: step}}}``,
    rewritten atomically by the sinks' threads (never the training thread)."""

    def __init__(self, path: pathlib.Path, resuming: bool) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {}
        if resuming:
            try:
                loaded = json.loads(path.read_text("utf-8"))
                self.data = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self.data = {}

    def entry(self, name: str) -> tuple[Optional[str], dict[str, int]]:
        entry = self.data.get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("run_id"), str):
            return None, {}
        seen = entry.get("seen")
        return entry["run_id"], dict(seen) if isinstance(seen, dict) else {}

    def started(self, name: str, run_id: str) -> None:
        with self._lock:
            old = self.data.get(name)
            seen = old.get("seen", {}) if isinstance(old, dict) and old.get("run_id") == run_id \
                else {}
            self.data[name] = {"run_id": run_id, "seen": seen}
            self._write()

    def delivered(self, name: str, seen: Mapping[str, int]) -> None:
        with self._lock:
            self.data.setdefault(name, {})["seen"] = dict(seen)
            self._write()

    def _write(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(self.data, sort_keys=True) + "\n")
        except OSError as e:
            logger.warning("trackers: could not record run ids in %s: %s", self.path, e)


class Trackers:
    """The chief's trackers; every method is cheap on the calling thread."""

    def __init__(self, sinks: Sequence[Sink], flush_seconds: float = FLUSH_SECONDS) -> None:
        self._sinks = tuple(sinks)
        self._flush_seconds = flush_seconds
        self._closed = False
        self._system_step = -1
        # A script that never closes its core.init() context still delivers (bounded).
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        self.close("errored" if getattr(sys, "last_value", None) is not None else "completed")

    def report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        item = ("metrics", group, int(steps_completed), dict(metrics))
        for sink in self._sinks:
            sink.put(item)

    def system(self, record: Mapping[str, Any]) -> None:
        """One profiler report (``core/_profiler.py``, the profiler's thread): MLflow's
        system metrics, numbered as MLflow numbers its samples."""
        from determined_launch.core.trackers._system import mlflow_names

        values = mlflow_names(record)
        if not values:
            return
        self._system_step += 1
        item = ("system", self._system_step, float(record.get("time") or time.time()), values)
        for sink in self._sinks:
            sink.put(item)

    def checkpoint(self, storage_id: str, storage_url: str) -> None:
        item = ("tags", {"det.checkpoint": storage_id,
                         "det.checkpoint_url": f"{storage_url.rstrip('/')}/{storage_id}"})
        for sink in self._sinks:
            sink.put(item)

    def after_commit(self, inner: Callable[[str, Mapping[str, Any]], None],
                     storage_url: str) -> Callable[[str, Mapping[str, Any]], None]:
        """``inner`` (the run's checkpoint log and retention), and the commit as tags."""
        def after_commit(storage_id: str, metadata: Mapping[str, Any]) -> None:
            self.checkpoint(storage_id, storage_url)
            inner(storage_id, metadata)

        return after_commit

    def close(self, state: str) -> None:
        """End every tracker run with ``state`` (one of ``STATES``), within the flush bound."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        deadline = time.monotonic() + self._flush_seconds
        for sink in self._sinks:
            sink.close(state, deadline)


def _backend(name: str, who: RunIdentity) -> Backend:
    if name == "mlflow":
        from determined_launch.core.trackers._mlflow import MlflowBackend

        return MlflowBackend(who)
    from determined_launch.core.trackers._wandb import WandbBackend

    return WandbBackend(who)


#: why the experiment's driver stopped a trial (core/_rundir.py's STOP_REASON) -> its state
STOPPED = {"pruned": "stopped (ASHA)", "done": "completed", "error": "errored",
           "driver": "preempted"}


def final_state(exc: Optional[BaseException], preempted: bool,
                stop_reason: Optional[str] = None) -> str:
    """How a ``core.Context`` block ended, as one of ``STATES``; a preemption
    the experiment's driver asked for says why (ASHA's stop is no preemption)."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        if preempted:
            return STOPPED.get(stop_reason or "", "preempted")
        return "completed"
    return "invalid" if isinstance(exc, InvalidHP) else "errored"


def from_env(env: Mapping[str, str], who: RunIdentity, *, resuming: bool,
             tensorboard_dir: Optional[pathlib.Path] = None) -> Optional[Trackers]:
    """``DET_REPORT_TO``'s trackers (``--report-to`` sets it for the workers)."""
    raw = env.get(envvars.REPORT_TO, "").strip()
    try:
        names = values.trackers(raw) if raw else ()
    except ValueError as e:
        raise LaunchError(f"environment variable {envvars.REPORT_TO}: {e}") from None
    if not names:
        return None
    return open_trackers(names, who, resuming=resuming, tensorboard_dir=tensorboard_dir)


def open_trackers(names: Sequence[str], who: RunIdentity, *, resuming: bool,
                  flush_seconds: float = FLUSH_SECONDS,
                  tensorboard_dir: Optional[pathlib.Path] = None) -> Optional[Trackers]:
    """The chief's trackers for ``names`` (``values.trackers``), or ``None`` when
    none is on. A missing package is one warning line and that tool is skipped:
    the launcher already refused it, so this is a bare process's mistake.
    ``tensorboard`` (its scalars are always written) adds the HParams summary
    to ``tensorboard_dir`` once per tracker run."""
    for line in _missing(names):
        logger.warning("%s; reporting without it", line)
    usable = [n for n in names if n in PACKAGES and not _missing([n])]
    if "tensorboard" in usable and tensorboard_dir is not None and not resuming:
        from determined_launch.core.trackers._hparams import write_session_start

        try:
            write_session_start(tensorboard_dir, who)
        except Exception as e:  # plots never stop training
            logger.warning("tensorboard: could not write the HParams summary: %s", e)
    usable = [n for n in usable if n != "tensorboard"]
    if not usable:
        return None
    state = _State(who.run_dir / STATE_FILE, resuming)
    sinks = []
    for name in usable:
        resume_id, seen = state.entry(name)
        sinks.append(Sink(_backend(name, who), resume_id, seen, state))
    return Trackers(sinks, flush_seconds)


#: Seconds ``end_abandoned`` waits for MLflow before saying it could not.
ABANDONED_SECONDS = 20.0


def end_abandoned(run_dir: pathlib.Path, state: str = "errored",
                  timeout: float = ABANDONED_SECONDS) -> Optional[str]:
    """End the MLflow run of a trial whose process was killed outright
    (SIGKILL, out of memory) and will not resume: nothing in that process could
    end it, so it would show ``RUNNING`` forever. The experiment's driver calls
    this when it gives a trial up. A run that is not ``RUNNING`` any more (the
    process ended it) is left alone. Returns one line to show, or ``None``.

    W&B is left alone: its offline and online runs end with the process that
    owns them (W&B marks a run whose process vanished as crashed itself)."""
    run_id, _ = _State(run_dir / STATE_FILE, resuming=True).entry("mlflow")
    if run_id is None or _missing(["mlflow"]):
        return None
    from determined_launch.core.trackers._mlflow import end_if_running

    outcome: list[str] = []

    def work() -> None:
        try:
            outcome.append(f"mlflow: run {run_id} ended as {state}"
                           if end_if_running(run_id, state) else "")
        except Exception as e:  # a tracker never decides the experiment's outcome
            outcome.append(f"mlflow: could not end run {run_id}: {str(e).splitlines()[0]}")

    # MLflow's client retries for minutes against a dead server: bounded here.
    thread = threading.Thread(target=work, name="det-trackers-end", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"mlflow: could not end run {run_id} within {timeout:.0f} s; it may still " \
               "show RUNNING"
    return outcome[0] or None
