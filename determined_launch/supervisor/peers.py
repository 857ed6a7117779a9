"""The verdict's multi-node half: what the chief and the other nodes do with
each other's messages, and the chief's failure window.

Part of the pure state machine in ``verdict.py`` (split out for size, not
for a different concern): functions of the ``Verdict`` whose state they
change, no I/O, no clock but the times they are given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from determined_launch.errors import EXIT_OK, EXIT_PREEMPTED
from determined_launch.supervisor.events import (
    Action,
    Broadcast,
    Failure,
    Kind,
    Phase,
    Role,
    SendToChief,
    message,
    pick_cause,
)
from determined_launch.supervisor.verdict_state import VerdictState

#: how a chief that never answered is described (``handoff.chief_unreachable``)
UNREACHED = "could not be reached"
#: how the verdict names the chief's launcher as a failure
CHIEF = "the chief's launcher"

#: the state these functions change (verdict.Verdict is one)
Verdict = VerdictState


def decide(v: Verdict, now: float, wall: float, out: list[Action]) -> None:
    """Chief: the window is over; freeze the verdict and tell every node."""
    v.window_ends = None
    cause = pick_cause(v.candidates)
    if cause is None or v.decided_cause is not None:
        return
    v.decided_cause = cause
    count = v.genuine_failures()
    out.append(Broadcast(message(Kind.ABORT, failure=cause.to_message(), failures=count)))
    v.begin_stop(cause.describe(), now, wall, out)


def chief_message(v: Verdict, msg: Mapping[str, Any], now: float, wall: float,
                  out: list[Action]) -> None:
    """The chief hears from a node: hello, a failure, a lost link, a preemption, done."""
    kind = msg.get("type")
    node = _int(msg.get("node"), -1)
    if kind == Kind.HELLO:
        v.connected.add(node)
    elif kind == Kind.FAILED:
        f = Failure.from_message(msg)
        if f is not None and f.what == CHIEF:
            # The node lost sight of this chief (it was stopped, or cut off) and goes on
            # without it: that node is lost to this chief, which is not "lost" itself.
            why = (f.how or "").removeprefix("was lost").strip()
            f = Failure(1, "the launcher", v.s.ident(node), v.s.addr(node), f.time,
                        how=f"lost sight of this chief{' ' + why if why else ''}")
        if f is not None:
            v.note(f, now, wall, out)
    elif kind == Kind.LOST and node not in v.node_results:
        how = str(msg.get("why") or "was lost")
        lost = Failure(1, "the launcher", v.s.ident(node), v.s.addr(node), wall, how=how)
        v.note(lost, now, wall, out)
    elif kind == Kind.PREEMPT:
        asked = f"was asked to preempt by node {v.s.ident(node)}"
        v.request_preemption(asked, None, now, wall, out)
    elif kind == Kind.DONE:
        v.node_results[node] = _int(msg.get("status"), 1)


def node_message(v: Verdict, msg: Mapping[str, Any], now: float, wall: float,
                 out: list[Action]) -> None:
    """A node hears from the chief: abort (with the verdict), preempt, finish, lost."""
    kind = msg.get("type")
    if kind == Kind.ABORT:
        failure = msg.get("failure")
        cause = Failure.from_message(failure) if isinstance(failure, Mapping) else None
        v.chief_cause = cause or pick_cause(v.candidates) or Failure(
            1, "the chief's launcher", v.s.ident(0), v.s.addr(0), wall, how="stopped the job")
        v.chief_failures = _int(msg.get("failures"), 1)
        v.begin_stop("the chief stopped the job", now, wall, out)
        v.set_result(v.chief_cause.status)
    elif kind == Kind.PREEMPT:
        # The chief asks only when its own workers listen, so this node's are late
        # (still starting: imports, a storage client), not deaf: they get the grace
        # period too. Stopped at once, the node ended the whole job as interrupted.
        v.begin_preemption("was asked to preempt by the chief", now, out)
    elif kind == Kind.FINISH:
        v.set_result(_int(msg.get("status"), 1))
        # A services-only node (ssh mode) ends with the chief's job.
        v.begin_stop("the job finished on the chief", now, wall, out)
    elif kind == Kind.LOST:
        v.chief_gone = True
        if v.phase in (Phase.RUNNING, Phase.PREEMPTING):
            v.note(Failure(1, "the chief's launcher", v.s.ident(0), v.s.addr(0), wall,
                           how=str(msg.get("why") or "was lost")), now, wall, out)
        elif v.result is None and not v.candidates:
            v.candidates.append(Failure(1, "the chief's launcher", v.s.ident(0), v.s.addr(0), wall,
                                        how=str(msg.get("why") or "was lost")))


def check_connected(v: Verdict, now: float, wall: float, out: list[Action]) -> None:
    """Chief: after ``connect_timeout``, a node that never said hello has failed."""
    if now - v.started_at < v.s.connect_timeout:
        return
    v.connect_checked = True
    missing = set(range(1, len(v.s.hosts))) - v.connected - set(v.node_results)
    if missing:
        node = min(missing)
        v.note(Failure(1, "the launcher", v.s.ident(node), v.s.addr(node), wall,
                       how=f"never connected within {v.s.connect_timeout:g}s"), now, wall, out)


def local_success(v: Verdict, now: float, wall: float, out: list[Action]) -> None:
    """This node's workers all succeeded: done alone; else report and drain."""
    # Workers that acknowledged a preemption stopped so they can resume,
    # whether the request came through us or from Python.
    status = EXIT_PREEMPTED if v.acked else EXIT_OK
    v.preempt_at = None
    if v.s.role == Role.SINGLE:
        v.set_result(status)
        v.begin_stop("the job finished", now, wall, out)
    elif v.s.role == Role.CHIEF:
        v.node_results[0] = status
        v.phase = Phase.DRAINING
    else:
        out.append(SendToChief(message(Kind.DONE, status=status)))
        v.phase = Phase.DRAINING


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
