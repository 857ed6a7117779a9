"""The pages' actions (``det-launch ui --actions``): pause, kill and activate an
experiment, as Determined's WebUI offers them.

Everything else in ui/ only reads. Pausing writes what the experiment's own
driver already watches, and nothing more: each running trial's ``preempt``
file in its trial directory (experiment/trial.py gives the trial's launcher
that path). The trial's ranks stop on one step and checkpoint, the launcher
exits "preempted, resumable", and the driver then stops the search, as after
a scheduler's preemption; rerunning the experiment's command resumes it
(Determined's "pause", then "activate").

Kill and activate are ``det experiment kill|activate`` (det/commands.py) run
as a subprocess on the experiment's root, so the pages and ``det`` do one
thing: kill marks the experiment canceled and stops its trials now (its
driver is signalled, else each running trial preempted); activate restarts
the detached driver of an experiment ``det e create`` made, with the command
it recorded (``det_driver.json``). Because activate runs that recorded
command, it refuses unless the experiment directory, its record and its
context are this user's and writable by nobody else (a tree others can
write must not choose what the server's user runs).

Who may: the server checks the token and a CSRF header before calling this
(server.py); this module checks what is asked for: an experiment served from
a local directory (a mirror of object storage is a copy: the experiment runs
elsewhere), its running trials only, files created inside its confined trial
directories without following a symlink.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from typing import Any, Optional

from determined_launch.common.redact import printable, redact_text
from determined_launch.exproot import trial_id_of
from determined_launch.ui import files
from determined_launch.ui.api import Api
from determined_launch.ui.trial_rows import TrialRows

PREEMPT_FILE = "preempt"  # experiment/trial.py's TrialProcess.preempt_file
#: det/state.py's record of the detached driver, and det/create.py's copy of the context
DRIVER_RECORD = "det_driver.json"
CONTEXT = "context"
#: det's verbs the pages offer beside pause
VERBS = ("kill", "activate")
DET_TIMEOUT_S = 60


class ActionError(Exception):
    """An action that cannot be done: the page shows the message (HTTP 409)."""


def _local(api: Api, name: str, verb: str) -> Optional[str]:
    """The experiment's directory, if it runs from this tree (not a mirror)."""
    exp_dir = api.catalog.experiments().get(name)
    if exp_dir is None:
        return None
    if any(files.confined(exp_dir, [local]) for local, _ in api.remotes):
        raise ActionError(f"experiment {name} is served from object storage; {verb} it on "
                          "the machine where it runs")
    return exp_dir


def pause_experiment(api: Api, name: str) -> Optional[dict[str, Any]]:
    """Ask every running trial of experiment ``name`` to stop and checkpoint.
    None if there is no such experiment."""
    exp_dir = _local(api, name, "pause")
    if exp_dir is None:
        return None
    record = files.read_json(os.path.join(exp_dir, "experiment.json"), api.roots) or {}
    running = [trial_id_of(t) for t in api.studies.trials(exp_dir, record)
               if t.state.name == "RUNNING" and not t.user_attrs.get("det_failed")]
    asked = [tid for tid in running if _request_stop(api, exp_dir, tid)]
    if not asked:
        raise ActionError(f"experiment {name} has no running trial to pause")
    return {"experiment": name, "preempted_trials": asked}


def _request_stop(api: Api, exp_dir: str, trial_id: int) -> bool:
    trial_dir = files.confined(TrialRows.trial_dir_of(exp_dir, trial_id), api.roots)
    if trial_dir is None or not os.path.isdir(trial_dir):
        return False  # not started here yet, or outside the served tree
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        os.close(os.open(os.path.join(trial_dir, PREEMPT_FILE), flags, 0o600))
    except OSError:
        return False  # a symlink planted there, or a directory we may not write
    return True


def det_verb(api: Api, name: str, verb: str) -> Optional[dict[str, Any]]:
    """``det experiment VERB ID`` (kill or activate) on experiment ``name``.
    None if there is no such experiment."""
    exp_dir = _local(api, name, verb)
    if exp_dir is None:
        return None
    record = files.read_json(os.path.join(exp_dir, "det_experiment.json"), api.roots) or {}
    exp_id = record.get("id")
    if isinstance(exp_id, bool) or not isinstance(exp_id, int) or exp_id <= 0:
        raise ActionError(f"experiment {name} has no id in an experiments root; use its "
                          "det-launch experiment command (Ctrl-C stops it, rerunning resumes)")
    if verb == "activate":
        _check_own(exp_dir, name)
        pid = _driver_running(exp_dir, api)
        if pid is not None:  # det would say "activated" and do nothing: the driver still stops
            raise ActionError(f"experiment {name} is still stopping (its driver, pid {pid}, "
                              "has not exited yet); activate it once it is paused")
    env = {**os.environ, "DET_EXPERIMENTS_DIR": os.path.dirname(exp_dir)}
    try:
        done = subprocess.run(  # noqa: S603 (our own CLI, fixed arguments)
            [sys.executable, "-m", "determined_launch.det", "experiment", verb, str(exp_id)],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=DET_TIMEOUT_S,
            check=False)
    except subprocess.TimeoutExpired:
        raise ActionError(f"det experiment {verb} {exp_id}: no answer in {DET_TIMEOUT_S} s"
                          ) from None
    said = (done.stdout + done.stderr).decode("utf-8", errors="replace").strip()
    last = redact_text(printable(said.splitlines()[-1] if said else ""))[:500]
    if done.returncode != 0:
        raise ActionError(last or f"det experiment {verb} {exp_id}: exit status "
                          f"{done.returncode}")
    return {"experiment": name, "id": exp_id, "action": verb, "message": last}


def _driver_running(exp_dir: str, api: Api) -> Optional[int]:
    """The pid of the experiment's detached driver if it still runs on this host."""
    record = files.read_json(os.path.join(exp_dir, DRIVER_RECORD), api.roots) or {}
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or isinstance(pid, bool) or not isinstance(
            pid, int) or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:  # a reused pid is not the driver
            return pid if b"determined_launch" in f.read(1 << 16) else None
    except OSError:
        return None


def _check_own(exp_dir: str, name: str) -> None:
    """Activate runs the command recorded in the tree: only from files of this
    user that nobody else may write."""
    for path in (exp_dir, os.path.join(exp_dir, DRIVER_RECORD), os.path.join(exp_dir, CONTEXT)):
        try:
            st = os.lstat(path)
        except OSError:
            raise ActionError(f"experiment {name} was not created by det e create ("
                              f"{os.path.basename(path)} missing); rerun its command to "
                              "resume it") from None
        if (st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                or stat.S_ISLNK(st.st_mode)):
            raise ActionError(f"experiment {name}: {os.path.basename(path)} is not this "
                              "user's alone; activate it with det e activate")
