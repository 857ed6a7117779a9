"""What happened to a trial or run, in words that are true (pure functions).

The launcher's last summary line is how its *job* ended, not how the trial
did: the experiment's driver stops a trial that reached its length, or that
ASHA stopped, through preemption, so its launcher says "job preempted after
the workers acknowledged; resumable (exit status 75)" although nothing is
left to resume. The trial's state comes from the study (``report.state_of``'s
rule) and ``stop_reason.json`` (why the driver stopped it); the launcher's
lines become a history of events, each said once, in those words.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any, Optional

from determined_launch.errors import EXIT_PREEMPTED

#: the launcher's lines (supervisor/verdict.py's summary, node.py's preemption notice)
_SUMMARY = re.compile(r"^det-launch[^:]*: (job (\w+).*\bexit status (\d+)\)?)$")
_SAW_PREEMPT = re.compile(r"^det-launch[^:]*: the launcher saw the preemption ")
#: stop_reason.json's reasons (core/_rundir.py's STOP_REASON)
SEARCHER_STOPS = ("done", "pruned")
#: a state -> the CSS class the pages give it (a state like "stopped (ASHA)" has spaces)
_SLUG = re.compile(r"[^a-z0-9]+")


#: det/state.py's mark of a killed experiment (Determined's CANCELED)
KILLED = "det_killed"


def killed(exp_dir: str) -> bool:
    return os.path.lexists(os.path.join(exp_dir, KILLED))


def unless_killed(state: str, exp_dir: str) -> str:
    """A trial left paused in a killed experiment is canceled: nothing resumes it."""
    return "canceled" if state == "paused" and killed(exp_dir) else state


def slug(state: str) -> str:
    return _SLUG.sub("-", state.lower()).strip("-")


def trial_ended(state: str, length: Optional[int], stop_reason: Optional[str],
                exit_status: Optional[int], outcome: Optional[str]) -> dict[str, Any]:
    """``ended`` (what happened, in words), and the ``exit_status``/``outcome``
    to show: a searcher's stop is no preemption and no exit status 75."""
    at = f" at length {length}" if length is not None else ""
    searcher_stop = exit_status == EXIT_PREEMPTED and (
        stop_reason in SEARCHER_STOPS or state in ("completed", "stopped (ASHA)"))
    if state == "completed":
        ended = f"completed{at}"
    elif state == "stopped (ASHA)":
        ended = f"stopped by the searcher (ASHA){at}"
    elif state == "paused":
        ended = "paused: checkpointed, resumable (activate it, or rerun its command)"
    elif state == "canceled":
        ended = "canceled: its experiment was killed"
    elif state == "failed":
        ended = "errored" + (f" (exit status {exit_status})" if exit_status else "")
    elif state == "invalid hparams":
        ended = "invalid hyperparameters (det.InvalidHP)"
    else:
        return {"ended": None, "exit_status": exit_status, "outcome": outcome}
    if searcher_stop:
        return {"ended": ended, "exit_status": None, "outcome": ended}
    return {"ended": ended, "exit_status": exit_status, "outcome": outcome}


def history(lines: Sequence[str], times: Sequence[Optional[float]], state: str,
            stop_reason: Optional[str], length: Optional[int],
            last_time: Optional[float]) -> list[dict[str, Any]]:
    """The launcher's lines as events, each once: a preemption's notice and
    its summary are one event; the last stop is the searcher's when the
    driver said so (``stop_reason``), earlier ones are pauses (the trial ran
    again after them). ``times``: when each line was written, where known;
    ``last_time``: when the log was last written (the last event's time, once
    the trial is no longer running, if its line's is not known)."""
    events: list[dict[str, Any]] = []
    notice: Optional[dict[str, Any]] = None
    for i, line in enumerate(lines):
        when = times[i] if i < len(times) else None
        if _SAW_PREEMPT.match(line):
            notice = {"kind": "stopping", "time": when, "text": "asked to checkpoint and stop"}
            continue
        m = _SUMMARY.match(line)
        if m is None:
            events.append({"kind": "launcher", "text": line, "time": when})
            continue
        code = int(m.group(3))
        if code == EXIT_PREEMPTED:
            events.append({"kind": "paused", "time": when, "exit_status": code,
                           "text": "paused: the workers checkpointed and stopped; resumable"})
        else:
            events.append({"kind": "succeeded" if code == 0 else "failed", "time": when,
                           "text": m.group(1), "exit_status": code})
        notice = None
    if notice is not None:  # asked to stop, not stopped yet
        events.append(notice)
    last = next((e for e in reversed(events) if e["kind"] != "launcher"), None)
    if last is not None and last["kind"] == "paused" and (
            stop_reason in SEARCHER_STOPS or state in ("completed", "stopped (ASHA)")):
        at = f" at length {length}" if length is not None else ""
        last.update(kind="searcher", exit_status=None, text=(
            f"stopped by the searcher (ASHA){at}" if (stop_reason == "pruned" or
                                                       state == "stopped (ASHA)")
            else f"completed: the searcher's length reached{at}"))
    if events and state != "running" and events[-1]["time"] is None:
        events[-1]["time"] = last_time
    return events


def run_state(exit_status: int) -> str:
    """A plain run's state once its launcher recorded how the job ended."""
    if exit_status == 0:
        return "completed"
    return "preempted" if exit_status == EXIT_PREEMPTED else "errored"


def run_ended(exit_status: int) -> str:
    state = run_state(exit_status)
    if state == "preempted":
        return "preempted: checkpointed, resumable (rerun the same command)"
    return state if exit_status == 0 else f"errored (exit status {exit_status})"


def output_tail(text: str, lines: int = 20) -> str:
    """The last ``lines`` lines of the output, without the launcher's own."""
    kept = [line for line in text.splitlines() if not line.startswith("det-launch")]
    return "\n".join(kept[-lines:])
