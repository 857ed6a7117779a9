"""The pages' one action: pause a running experiment (``det-launch ui --actions``).

Everything else in ui/ only reads. Pausing writes what the experiment's own
driver already watches, and nothing more: each running trial's ``preempt``
file in its trial directory (experiment/trial.py gives the trial's launcher
that path). The trial's ranks stop on one step and checkpoint, the launcher
exits "preempted, resumable", and the driver then stops the search, as after
a scheduler's preemption; rerunning the experiment's command resumes it
(Determined's "pause", then "activate").

Who may: the server checks the token and a CSRF header before calling this
(server.py); this module checks what is asked for: an experiment served from
a local directory (a mirror of object storage is a copy: the experiment runs
elsewhere), its running trials only, files created inside its confined trial
directories without following a symlink.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from determined_launch.exproot import trial_id_of
from determined_launch.ui import files
from determined_launch.ui.api import Api
from determined_launch.ui.trial_rows import TrialRows

PREEMPT_FILE = "preempt"  # experiment/trial.py's TrialProcess.preempt_file


class ActionError(Exception):
    """An action that cannot be done: the page shows the message (HTTP 409)."""


def pause_experiment(api: Api, name: str) -> Optional[dict[str, Any]]:
    """Ask every running trial of experiment ``name`` to stop and checkpoint.
    None if there is no such experiment."""
    exp_dir = api.catalog.experiments().get(name)
    if exp_dir is None:
        return None
    if any(files.confined(exp_dir, [local]) for local, _ in api.remotes):
        raise ActionError(f"experiment {name} is served from object storage; pause it on "
                          "the machine where it runs")
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
