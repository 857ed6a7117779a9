"""What ``det`` shows of an experiment: its state, progress and trials, in
Determined's words, from the root (exproot.py), the study (read as the
UI reads it, ui/study.py) and the files ``det e create`` keeps beside them::

    <exp>/det_driver.json   the detached driver: pid, host, start; or the SLURM job
    <exp>/det_end.json      how the driver ended (its exit status, when)
    <exp>/det_killed        ``det e kill``/``cancel`` was here (Determined's CANCELED)
    <exp>/det_paused        ``det e pause`` was here (a SLURM worker is then not requeued)
    <exp>/experiment.log    the driver's own output (each trial's is trials/<id>/output.log)
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import pathlib
import shutil
import socket
import subprocess
from typing import Any, Optional

from determined_launch.errors import EXIT_PREEMPTED
from determined_launch.experiment import report
from determined_launch.experiment.owners import ATTR_SLOT
from determined_launch.exproot import Experiment, trial_id_of
from determined_launch.ui.study import Studies, StudyError

DRIVER = "det_driver.json"
END = "det_end.json"
KILLED = "det_killed"
PAUSED = "det_paused"
LOG = "experiment.log"
#: report.state_of's words -> Determined's trial states
TRIAL_STATES = {"completed": "COMPLETED", "stopped (ASHA)": "COMPLETED", "running": "RUNNING",
                "waiting": "QUEUED", "failed": "ERROR", "paused": "PAUSED",
                "invalid hparams": "CANCELED"}
FINAL = ("COMPLETED", "CANCELED", "ERROR")
SLURM_STATES = {"PENDING": "QUEUED", "CONFIGURING": "QUEUED", "REQUEUED": "QUEUED",
                "RUNNING": "RUNNING", "COMPLETING": "RUNNING", "SUSPENDED": "PAUSED"}


def read_json(path: pathlib.Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read(1 << 20))
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def write_json(path: pathlib.Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def pid_alive(record: dict[str, Any]) -> bool:
    """Whether the recorded local process still runs (another host's: unknown, False)."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child (the `det` that started it still waits) is not running,
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:  # nor a process that reused its pid
            return b"determined_launch" in f.read(1 << 16)
    except (OSError, IndexError):
        return True


def slurm_state(job: Any) -> Optional[str]:
    """squeue's state of a SLURM job (an array: its most active task), None when gone."""
    if not job or shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True,
                             text=True, timeout=10, check=False).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    states = [SLURM_STATES.get(s, "") for s in out]
    for s in ("RUNNING", "QUEUED", "PAUSED"):
        if s in states:
            return s
    return None


@dataclasses.dataclass
class Trial:
    id: int
    state: str
    hparams: dict[str, Any]
    start: Optional[float]
    end: Optional[float]
    dir: pathlib.Path
    best: Optional[float]
    batches: Optional[int]


@dataclasses.dataclass
class View:
    """One experiment as ``det`` shows it."""

    exp: Experiment
    record: dict[str, Any]
    trials: list[Trial]
    state: str
    error: Optional[str] = None

    @property
    def searcher(self) -> dict[str, Any]:
        s = self.record.get("searcher")
        return s if isinstance(s, dict) else {}

    @property
    def progress(self) -> Optional[float]:
        total = int(self.searcher.get("max_trials") or 0)
        done = sum(1 for t in self.trials if t.state in FINAL)
        return min(1.0, done / total) if total else None

    @property
    def started(self) -> Optional[float]:
        return self.exp.created or None

    @property
    def ended(self) -> Optional[float]:
        if self.state not in FINAL and self.state != "PAUSED":
            return None
        end = read_json(self.exp.dir / END).get("ended")
        if isinstance(end, (int, float)):
            return float(end)
        ends = [t.end for t in self.trials if t.end is not None]
        return max(ends) if ends else None

    @property
    def owner(self) -> str:
        try:
            import pwd

            return pwd.getpwuid(self.exp.dir.stat().st_uid).pw_name
        except (ImportError, KeyError, OSError):
            return getpass.getuser()

    @property
    def pool(self) -> str:
        return "slurm" if read_json(self.exp.dir / DRIVER).get("slurm_job") else "local"


def _batches(run_dir: pathlib.Path) -> Optional[int]:
    first = report.progress_of(run_dir).split(" ", 1)[0]
    return int(first) if first.isdigit() else None


def _hparams(trial_dir: pathlib.Path) -> dict[str, Any]:
    """All of a trial's hparams (constants too, as Determined shows them): its cluster info's."""
    trial = read_json(trial_dir / "cluster_info.json").get("trial")
    hparams = trial.get("hparams") if isinstance(trial, dict) else None
    return dict(hparams) if isinstance(hparams, dict) else {}


def new_studies(root: pathlib.Path) -> Studies:
    """The UI's study reader, confined to the root (studies outside it are not read)."""
    try:
        return Studies(None, roots=(str(root),))  # type: ignore[call-arg,unused-ignore]
    except TypeError:  # a reader without confinement
        return Studies(None)


def view(exp: Experiment, studies: Optional[Studies] = None) -> View:
    record = read_json(exp.dir / "experiment.json")
    smaller = bool((record.get("searcher") or {}).get("smaller_is_better", True))
    error = None
    try:
        raw = report.visible((studies or new_studies(exp.dir.parent)).trials(str(exp.dir),
                                                                         record))
    except StudyError as e:
        raw, error = [], str(e)
    trials = []
    for t in raw:
        if t.state.name == "RUNNING" and ATTR_SLOT not in t.user_attrs:
            continue  # being asked: its id is not written yet (a trial starts with its slot)
        tid = trial_id_of(t)
        d = exp.dir / "trials" / str(tid)
        trials.append(Trial(
            id=tid, state=TRIAL_STATES.get(report.state_of(t), report.state_of(t).upper()),
            hparams=_hparams(d) or dict(report.hparams_of(t)),
            start=t.datetime_start.timestamp() if t.datetime_start else None,
            end=t.datetime_complete.timestamp() if t.datetime_complete else None,
            dir=d, best=report.best_value(t, smaller), batches=_batches(d)))
    trials.sort(key=lambda t: t.id)
    v = View(exp, record, trials, "ACTIVE", error)
    v.state = experiment_state(v)
    if v.state == "CANCELED":
        for t in v.trials:
            if t.state not in FINAL:
                t.state = "CANCELED"
    return v


def experiment_state(v: View) -> str:
    d = v.exp.dir
    driver = read_json(d / DRIVER)
    alive = pid_alive(driver)
    if (d / KILLED).exists():
        return "STOPPING_CANCELED" if alive else "CANCELED"
    if alive:
        return "ACTIVE"
    queued = slurm_state(driver.get("slurm_job"))
    if queued is not None:
        return queued
    end = read_json(d / END)
    status = end.get("status")
    if isinstance(status, int) and end.get("started") == driver.get("started"):
        if status == 0:
            return "COMPLETED"
        return "PAUSED" if status == EXIT_PREEMPTED else "ERROR"
    # run by det-launch experiment itself (or its workers): the study says
    if any(t.state in ("RUNNING", "QUEUED") for t in v.trials):
        return "ACTIVE"
    total = int(v.searcher.get("max_trials") or 0)
    if v.trials and all(t.state in FINAL for t in v.trials) and len(v.trials) >= total:
        return "COMPLETED" if any(t.state == "COMPLETED" for t in v.trials) else "ERROR"
    return "PAUSED" if v.trials or driver else "ACTIVE"
