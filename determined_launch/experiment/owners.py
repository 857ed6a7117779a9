"""Who runs which trial: owners, heartbeats, and taking a trial over.

A trial is owned by the process that runs it (``det_owner``: host, pid, start
time) and kept alive by its heartbeat (``det_heartbeat``), both in the study,
so any number of drivers and ``--worker`` processes can share one experiment.
A trial is taken over in two cases:

* abandoned: still RUNNING in the study but its owner is gone (same host and
  its pid gone, or no heartbeat for ``LEASE`` seconds); it continues from its
  latest checkpoint;
* failed: a trial that failed (``det_failed``) stays open in the study, so that
  rerunning the experiment after fixing the script retries it from its latest
  checkpoint, as Determined continues an errored trial. Optuna cannot reopen a
  finished trial, and a new Optuna trial would be a new trial id; so a failure
  is kept as an attribute of a RUNNING trial whose owner is cleared, and every
  reader (``report.state_of``) calls it failed.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Optional

from determined_launch.experiment import searchers as se

#: seconds between heartbeats of a running trial's owner
HEARTBEAT = 10.0
#: a RUNNING trial whose owner has not beaten for this long is abandoned
LEASE = 60.0
ATTR_OWNER = "det_owner"
ATTR_BEAT = "det_heartbeat"
ATTR_SLOT = "det_slot"
#: a trial whose last run failed (kept RUNNING in the study, owner cleared)
ATTR_FAILED = "det_failed"


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{time.time():.3f}"


def owner_alive(owner: str, beat: float, now: float) -> bool:
    host, _, rest = owner.partition(":")
    pid = rest.split(":", 1)[0]
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return now - beat < LEASE * 10  # a recycled pid of a stuck host is still bounded
    return now - beat < LEASE


def is_failed(t: Any) -> bool:
    """Whether the trial failed: open (RUNNING) with ``det_failed``, or FAIL with an
    error (recorded so by an older version; not retried). Invalid hparams and
    surplus trials are not failures."""
    if t.user_attrs.get(se.ATTR_INVALID) or t.user_attrs.get(se.ATTR_SURPLUS):
        return False
    if t.state.name == "RUNNING":
        return bool(t.user_attrs.get(ATTR_FAILED))
    return t.state.name == "FAIL" and bool(t.user_attrs.get(se.ATTR_ERROR))


def is_live(t: Any, now: float) -> bool:
    """A RUNNING trial whose owner still runs it."""
    owner = str(t.user_attrs.get(ATTR_OWNER, ""))
    return (t.state.name == "RUNNING" and not t.user_attrs.get(ATTR_FAILED) and bool(owner)
            and owner_alive(owner, float(t.user_attrs.get(ATTR_BEAT, 0) or 0), now))


def to_retry(trials: Sequence[Any], now: float) -> list[int]:
    """The failed trials a rerun retries (their numbers), or none while another
    process still runs a trial of the experiment: a worker that starts late in a
    running search must not retry a failure the running ones have just given up on."""
    if any(is_live(t, now) for t in trials):
        return []
    return [t.number for t in trials if t.state.name == "RUNNING" and is_failed(t)]


def claim(study: Any, optuna: Any, t: Any, owner: str) -> Optional[Any]:
    """Take the RUNNING trial ``t`` for ``owner``: write the owner, wait, read it
    back (two claimers: the later write wins, and both read it). The claimed
    ``optuna.trial.Trial``, or ``None`` when another process won."""
    trial = optuna.trial.Trial(study, t._trial_id)
    trial.set_user_attr(ATTR_OWNER, owner)
    trial.set_user_attr(ATTR_BEAT, time.time())
    time.sleep(0.2)
    latest = study._storage.get_trial(t._trial_id)
    if latest.user_attrs.get(ATTR_OWNER) == owner and latest.state.name == "RUNNING":
        return trial
    return None


def mark_failed(trial: Any, error: str) -> None:
    """The trial's run failed for good: keep it open for a rerun (the module doc).
    ``det_failed`` goes first: with the owner cleared first, another worker
    would take it for an abandoned trial and run it again at once."""
    trial.set_user_attr(se.ATTR_ERROR, error)
    trial.set_user_attr(ATTR_FAILED, True)
    trial.set_user_attr(ATTR_OWNER, "")
