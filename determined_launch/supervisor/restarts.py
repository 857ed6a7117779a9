"""``--max-restarts N``: whether a job whose generation ended restarts (pure).

A *generation* is one start of every node's workers. When it ends with a
genuine failure, all nodes' workers are already stopped (the verdict's
fail-fast); the chief's launcher then asks ``decide`` whether to start the
next generation, which resumes from the newest committed checkpoint. Nothing
here touches a process, a file or the clock: the node loop gathers the facts
(``Attempt``), ``decide`` answers, and the answer travels to the other nodes
as a message (``to_message`` / ``from_message``), so every node acts on the
chief's one decision.

Rules, in order:

* success, an acknowledged preemption (exit 75, resumable) and an
  interruption (Ctrl-C, a scheduler's TERM to a job that does not listen)
  are final: none of them is a failure to retry;
* ``max_restarts`` restarts at most;
* a lost node (its launcher died, went silent or never connected) is final
  too without ``--min-nodes``: every node must take part in the next
  generation; with ``--min-nodes K`` the job continues on the others while
  at least K remain, and that continuation uses one restart (the chief's
  loss included: the survivors, the same nodes minus the lost ones, are
  led by the lowest-ranked of them);
* a failure that repeats at the same point stops early: the same exit status
  as the failure before it, and no checkpoint committed since that restart
  (the restart resumed from the same checkpoint and got nowhere), so a further
  restart would replay the same steps and fail the same way. Only the
  program's own exit statuses count: a death by a signal (128+N: SIGKILL by
  the OOM killer or an operator, a SIGSEGV of a flaky driver) says nothing
  about the program's determinism, so two unrelated kills within one
  checkpoint interval use restarts like any other failure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Protocol

from determined_launch.errors import EXIT_OK, EXIT_PREEMPTED
from determined_launch.supervisor.events import Failure


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where the job stands: its newest committed checkpoint (``None``: none
    yet) and that checkpoint's ``steps_completed`` when its metadata says."""

    checkpoint: Optional[str] = None
    steps: Optional[int] = None

    def describe(self) -> str:
        if self.checkpoint is None:
            return "no checkpoint"
        steps = "" if self.steps is None else f", steps_completed {self.steps}"
        return f"checkpoint {self.checkpoint}{steps}"


@dataclasses.dataclass(frozen=True)
class Attempt:
    """How one generation ended."""

    generation: int
    status: int
    #: the verdict's cause, as the summary words it ("rank 1 on node 0 (h) exited with status 3")
    cause: str
    #: stopped on request (SIGINT, an unheeded preemption), not a failure
    interrupted: bool
    #: what it resumed from, and the newest committed checkpoint when it ended
    start: Progress
    end: Progress
    #: a node's launcher was lost or never connected: the same nodes cannot restart
    node_lost: bool = False
    #: the generation's nodes and those of them lost (original ranks)
    members: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    #: nodes that asked to rejoin; the generation was preempted to make room for them
    joining: tuple[int, ...] = ()

    @property
    def rejoined(self) -> bool:
        """Ended by the preemption that makes room for rejoining nodes: not a restart."""
        return bool(self.joining) and self.status == EXIT_PREEMPTED and not self.cause


@dataclasses.dataclass(frozen=True)
class Decision:
    restart: bool
    #: one line: why the job restarts or why it does not (empty: nothing to say)
    why: str = ""
    #: the failure repeated at the same point: restarting was stopped early
    repeated: bool = False
    #: the next generation's resume point (restart only)
    resume: Progress = Progress()
    generation: int = 0
    #: for the final summary: the restarts made and why (``history``)
    history: str = ""
    #: the next generation's nodes (original ranks); empty: the same as before
    members: tuple[int, ...] = ()

    def to_message(self) -> dict[str, Any]:
        return {"restart": self.restart, "why": self.why, "repeated": self.repeated,
                "checkpoint": self.resume.checkpoint, "steps": self.resume.steps,
                "generation": self.generation, "history": self.history,
                "members": list(self.members)}

    @classmethod
    def from_message(cls, msg: Mapping[str, Any]) -> Decision:
        """The chief's decision as a node received it (malformed: no restart)."""
        checkpoint, steps, gen = msg.get("checkpoint"), msg.get("steps"), msg.get("generation")
        members = msg.get("members", [])
        ok = (isinstance(msg.get("restart"), bool)
              and (checkpoint is None or isinstance(checkpoint, str))
              and (steps is None or isinstance(steps, int))
              and isinstance(members, list) and all(type(m) is int for m in members))
        if not ok or not isinstance(gen, int):
            return cls(False, "the chief's restart decision was malformed; not restarting")
        return cls(bool(msg["restart"]), str(msg.get("why") or ""), bool(msg.get("repeated")),
                   Progress(checkpoint, steps), gen, str(msg.get("history") or ""),
                   tuple(members))


#: exit statuses a launcher reports for a death by signal N (128+N, as shells do)
SIGNAL_STATUSES = range(129, 129 + 64)


def repeated(previous: Attempt, last: Attempt) -> bool:
    """``last`` failed as ``previous`` did, at the same point: same status,
    which the program chose itself (not a death by a signal), and the restart
    between them committed no checkpoint."""
    return (last.status == previous.status and last.status not in SIGNAL_STATUSES
            and last.start == last.end and previous.end == last.start
            and not (previous.node_lost or previous.lost))


def nodes(ranks: Sequence[int]) -> str:
    """``node 2`` / ``nodes 0, 2``."""
    return f"node{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}"


def decide(max_restarts: int, attempts: Sequence[Attempt], initial: Progress,
           min_nodes: Optional[int] = None) -> Decision:
    """After ``attempts[-1]`` ended: restart, or stop with the reason and the
    history of the restarts made (see ``_decide``)."""
    decision = _decide(max_restarts, attempts, initial, min_nodes)
    if decision.restart:
        return decision
    return dataclasses.replace(decision, history=history(attempts))


def _decide(max_restarts: int, attempts: Sequence[Attempt], initial: Progress,
            min_nodes: Optional[int]) -> Decision:
    """After ``attempts[-1]`` ended: restart, or stop with the reason.

    ``initial`` is the resume point the job started from; a restart resumes
    from the newest checkpoint this job committed, else from ``initial``
    (``--fresh``'s fresh start, or the cluster info's checkpoint, again).
    ``min_nodes``: ``--min-nodes`` (``None``: every node is needed).
    """
    last = attempts[-1]
    done = sum(not a.rejoined for a in attempts[:-1])  # restarts already made
    if last.rejoined:  # scale back up: not a failure, uses no restart
        # (without a chief lost meanwhile: its survivors decide alone, and agree)
        members = tuple(sorted((set(last.members) - set(last.lost)) | set(last.joining)))
        resume = last.end if last.end.checkpoint is not None else initial
        verb = "rejoins" if len(last.joining) == 1 else "rejoin"
        gone = f" without {nodes(last.lost)}" if last.lost else ""
        return Decision(True, (f"{nodes(last.joining)} {verb}: continuing on {nodes(members)}"
                               f"{gone} (generation {last.generation + 1}); resuming from "
                               f"{resume.describe()}"),
                        resume=resume, generation=last.generation + 1, members=members)
    if last.status == EXIT_OK or (last.status == EXIT_PREEMPTED and not last.cause):
        return Decision(False)
    if last.interrupted:
        return Decision(False, f"not restarted: the job was stopped on request ({last.cause})"
                        if max_restarts else "")
    if max_restarts == 0:
        return Decision(False)
    members = last.members
    if last.node_lost or last.lost:
        also = "" if last.node_lost else f"; {nodes(last.lost)} lost"
        if min_nodes is None or not last.lost:
            return Decision(False, f"not restarting: {last.cause}{also}; a restart needs every "
                                   f"node")
        members = tuple(n for n in last.members if n not in last.lost)
        if len(members) < min_nodes:
            return Decision(False, (
                f"not restarting: {last.cause}; {nodes(last.lost)} lost: {len(members)} of "
                f"{len(last.members)} nodes left, fewer than --min-nodes {min_nodes}"))
    elif len(attempts) >= 2 and repeated(attempts[-2], last):
        return Decision(False, (
            f"not restarting: the same failure (exit status {last.status}) repeated at the same "
            f"point ({last.end.describe()}): restart {done} committed no checkpoint, so another "
            f"would fail the same way"), repeated=True)
    if done >= max_restarts:
        return Decision(False, f"not restarting: all {max_restarts} restart"
                               f"{'s' if max_restarts > 1 else ''} used")
    resume = last.end if last.end.checkpoint is not None else initial
    where = ""
    if members != last.members:  # the chief is the lowest surviving node: every node agrees
        where = f"; continuing without {nodes(last.lost)} on {nodes(members)}"
    return Decision(True, (f"restart {done + 1} of {max_restarts} after {last.cause} "
                           f"(generation {last.generation}){where}; resuming from "
                           f"{resume.describe()}"),
                    resume=resume, generation=last.generation + 1, members=members)


def history(attempts: Sequence[Attempt]) -> str:
    """What the final summary adds when restarts happened: how many, and why."""
    failed = [a for a in attempts[:-1] if not a.rejoined]
    if not failed:
        return ""
    n = len(failed)
    whys = "; ".join(f"{a.generation + 1}: {a.cause}" for a in failed)
    return f" after {n} restart{'s' if n > 1 else ''} ({whys})"


class RestartJudge(Protocol):
    """Whether the job restarts, as the supervisor asks it (``generations.Restarts``)."""

    def decide(self, status: int, cause: Optional[Failure],
               lost: frozenset[int] = frozenset(), joining: tuple[int, ...] = ()) -> Decision:
        """From this generation's exit status, cause, the nodes (its ranks)
        whose launchers are gone and the nodes (original ranks) it was
        preempted for, to let them rejoin."""

    def follow(self, decision: Decision) -> Decision:
        """The chief's decision, as this node takes it."""
