"""The end of a generation on several nodes: the chief's restart decision
reaches every node over the generation's control link before it closes.

The chief sends its ``restarts.Decision`` (``Kind.NEXT``) and waits until
every node has hung up, which a node does only once all its workers of this
generation are gone: so no worker of an old generation is alive when the
next generation's processes (and its new control channel and job secret)
start anywhere. A node waits for that decision; a chief that vanishes
instead leaves the node to decide alone (``--min-nodes``: the survivors
continue without it; otherwise no restart).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

from determined_launch.errors import EXIT_PREEMPTED
from determined_launch.supervisor.control import ChiefLink, ControlLink
from determined_launch.supervisor.events import Failure, Kind, Message, Role, Settings, message
from determined_launch.supervisor.peers import UNREACHED
from determined_launch.supervisor.restarts import Decision, RestartJudge

_POLL = 0.05


def announce(link: ChiefLink, decision: Decision, timeout: float) -> Decision:
    """Chief: tell every node, then wait (at most ``timeout``) for all of them
    to hang up. A node still connected then may still run old workers: the
    job does not restart."""
    # First: a node that already starts the next generation must not reach this one's key.
    link.stop_listening()
    link.broadcast(message(Kind.NEXT, **decision.to_message()))
    deadline = time.monotonic() + timeout
    while link.connected_nodes and time.monotonic() < deadline:
        time.sleep(_POLL)
    stuck = sorted(link.connected_nodes)
    if not stuck or not decision.restart:
        return decision
    nodes = ", ".join(str(n) for n in stuck)
    final = Decision(False, f"not restarting: node {nodes} did not stop its workers within "
                            f"{timeout:g}s", history=decision.history)
    link.broadcast(message(Kind.NEXT, **final.to_message()))  # the stuck ones read the last
    return final


def await_chief(link: ControlLink, early: Optional[Message], timeout: float
                ) -> Optional[Decision]:
    """Node: the chief's decision (``early``: one that arrived while this node
    was still stopping; a later one, sent when the chief gave up waiting for
    this node, replaces it), ``None`` if the chief was lost before it decided,
    or no restart if it stays silent."""
    deadline = time.monotonic() + timeout
    msg = early
    while True:
        lost = False
        while link.inbox:
            m = link.inbox.popleft()
            if m.get("type") == Kind.NEXT:
                msg = m
            lost = lost or m.get("type") == Kind.LOST
        if msg is not None:
            return Decision.from_message(msg)
        if lost:
            return None
        if time.monotonic() >= deadline:
            return Decision(False, f"not restarting: no word from the chief's launcher within "
                                   f"{timeout:g}s")
        time.sleep(_POLL)


def chief_decides(link: ChiefLink, judge: RestartJudge, status: int, cause: Optional[Failure],
                  timeout: float, joining: tuple[int, ...] = ()) -> Decision:
    """Chief: decide (the nodes not connected now are lost; ``joining``: the
    nodes it preempted the generation for) and tell every node."""
    lost = frozenset(range(1, link.num_nodes)) - link.connected_nodes
    return announce(link, judge.decide(status, cause, lost, joining), timeout)


def node_decides(link: ControlLink, judge: RestartJudge, status: int, cause: Optional[Failure],
                 chief_gone: bool, early: Optional[Message], timeout: float,
                 joining: Optional[Callable[[], tuple[int, ...]]] = None) -> Decision:
    """Node: follow the chief's decision, keeping this node's own record of
    the generation; with no chief to ask (``chief_gone``: its loss was this
    generation's news), decide alone, as every survivor does, by the same
    rule (the same nodes minus the chief, with ``--min-nodes``; else no
    restart), so that they agree. A generation the chief preempted for
    rejoining nodes (``joining``: who asks) continues with them."""
    if not chief_gone:
        word = await_chief(link, early, timeout)
        if word is not None:
            judge.decide(status, cause)
            return judge.follow(word)
    asking = joining() if joining is not None and status == EXIT_PREEMPTED else ()
    return judge.decide(status, cause, frozenset({0}), asking)


def no_link(judge: RestartJudge, s: Settings, error: Exception) -> Decision:
    """This generation's control channel could not be opened (``error``): a
    chief that cannot listen (its port is taken) says so and does not lead
    it, never calling itself lost; a node decides without the chief."""
    if s.role != Role.CHIEF:
        return chief_unreachable(judge, s, error)
    # recorded as this generation's loss of its chief, so the others' continuing is the job's
    # (and this node does not end it for them)
    cause = Failure(1, "the chief's launcher", s.ident(0), s.addr(0), time.time(),
                    how="could not listen")
    decision = judge.decide(1, cause, frozenset({0}))
    return Decision(False, f"not restarting: this node cannot lead the job's generation here: "
                           f"{error}; exit status 1", history=decision.history)


def chief_unreachable(judge: RestartJudge, s: Settings, error: Exception) -> Decision:
    """Node: this generation's chief never answered (``error``), so no worker
    started: decide alone, as for the chief's loss (with ``--min-nodes``, a
    survivor chosen as chief that died too is skipped). Not restarting says
    why and how the job ended, in one line."""
    how = f"{UNREACHED} within its connect timeout ({str(error).split(' (')[0]})"
    cause = Failure(1, "the chief's launcher", s.ident(0), s.addr(0), time.time(), how=how)
    decision = judge.decide(1, cause, frozenset({0}))
    if decision.restart:
        return decision
    why = decision.why or f"not restarting: {cause.describe()}"
    return dataclasses.replace(decision, why=f"{why}; job failed (exit status 1)"
                                             f"{decision.history}")
