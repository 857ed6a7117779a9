"""The vocabulary of supervision: what happened (events), what to do
(actions), and why a job stopped (``Failure``). Plain frozen data, no logic
beyond formatting, shared by the verdict and the node loop."""

from __future__ import annotations

import dataclasses
import enum
import signal
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

Message = dict[str, Any]


class Kind(str, enum.Enum):
    """The ``type`` of every control-channel message (a ``str``, so it is
    its own JSON encoding and compares equal to the decoded string)."""

    HELLO = "hello"  # node -> chief, first line of a connection
    HEARTBEAT = "heartbeat"
    BYE = "bye"  # a clean goodbye: the peer is closing on purpose
    FAILED = "failed"  # node -> chief: a failure (or interruption) report
    PREEMPT = "preempt"  # either way: preemption requested
    DONE = "done"  # node -> chief: this node's workers finished (status)
    ABORT = "abort"  # chief -> nodes: stop; the verdict and the failure count
    FINISH = "finish"  # chief -> nodes: the job is over (status)
    LOST = "lost"  # put in the inbox by the link itself: a peer vanished (why)
    NEXT = "next"  # chief -> nodes, as a generation ends: restart or not (restarts.Decision)


def message(kind: Kind, **fields: Any) -> Message:
    return {"type": kind.value, **fields}
#: Exit statuses of processes stopped by a teardown (TERM, KILL, INT).
_TEARDOWN_STATUSES = frozenset(128 + s for s in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT))


def describe_status(status: int) -> str:
    if status > 128:
        try:
            return f"was killed by {signal.Signals(status - 128).name} (status {status})"
        except ValueError:
            pass
    return f"exited with status {status}"


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why the job stopped: a genuine failure, or an interruption.

    ``time`` is wall-clock seconds when it happened (status files and
    messages from other hosts carry it). ``how`` replaces the usual "exited
    with status N" (a lost launcher, an expired grace period).
    ``interrupt`` marks a stop someone asked for (SIGINT, an unheeded
    preemption): never preferred over a genuine failure. ``blames``: the
    ranks (``what`` of their failures) whose loss caused this one.
    """

    status: int
    what: str
    node: int
    host: str
    time: float
    how: Optional[str] = None
    interrupt: bool = False
    blames: tuple[str, ...] = ()

    def describe(self) -> str:
        how = self.how or describe_status(self.status)
        return f"{self.what} on node {self.node} ({self.host}) {how}"

    def to_message(self) -> Message:
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, msg: Mapping[str, Any]) -> Optional[Failure]:
        try:
            how = msg.get("how")
            return cls(
                status=int(msg["status"]),
                what=str(msg["what"]),
                node=int(msg["node"]),
                host=str(msg["host"]),
                time=float(msg["time"]),
                how=None if how is None else str(how),
                interrupt=bool(msg.get("interrupt", False)),
                blames=tuple(str(b) for b in msg.get("blames", ())[:32]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def pick_cause(candidates: Sequence[Failure]) -> Optional[Failure]:
    """The earliest genuine failure; else the earliest interruption. A failure
    caused by losing a rank that failed too is that rank's consequence, never
    the cause, whichever exited first."""
    genuine = [f for f in candidates if not f.interrupt]
    failed = {f.what for f in genuine}
    primary = [f for f in genuine if failed.isdisjoint(f.blames)]
    pool = primary or genuine or list(candidates)
    return min(pool, key=lambda f: f.time) if pool else None


class Phase(enum.Enum):
    RUNNING = "running"
    PREEMPTING = "preempting"  # grace period: workers may checkpoint and exit
    STOPPING = "stopping"  # TERM sent, KILL pending
    DRAINING = "draining"  # local work done, waiting for the job's result
    DONE = "done"


class Role(enum.Enum):
    SINGLE = "single"  # single-node job: no control channel
    CHIEF = "chief"
    NODE = "node"  # a non-chief node of a multi-node job


# ----------------------------------------------------------------- events
@dataclasses.dataclass(frozen=True)
class ProcessExited:
    """One of the plan's processes (``index`` into it) has exited."""

    index: int
    status: int
    time: float


@dataclasses.dataclass(frozen=True)
class RankExited:
    """wrap_rank's status file: rank ``rank`` exited with ``status`` at ``time``."""

    rank: int
    status: int
    time: float


@dataclasses.dataclass(frozen=True)
class RankLostPeers:
    """Rank ``rank``'s collectives failed because ``peers`` vanished."""

    rank: int
    peers: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RankHung:
    """The hang watchdog: rank ``rank`` made no progress for ``silent`` seconds."""

    rank: int
    silent: float


@dataclasses.dataclass(frozen=True)
class RankFinished:
    """Rank ``rank``'s core.init() exited cleanly: its work is done."""

    rank: int


@dataclasses.dataclass(frozen=True)
class SignalReceived:
    sig: int


@dataclasses.dataclass(frozen=True)
class PreemptFileAppeared:
    path: str


@dataclasses.dataclass(frozen=True)
class JoinRequested:
    """Nodes (original ranks) ask to rejoin the job (``--min-nodes``): the chief
    preempts the generation, so the next one starts with them."""

    nodes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Superseded:
    """The run directory's claims say this generation is over (``--min-nodes``:
    a later one was claimed): stop its workers at once, no checkpoint."""

    why: str


@dataclasses.dataclass(frozen=True)
class PreemptListening:
    """A worker on this node watches for preemption (``core.init`` did)."""


@dataclasses.dataclass(frozen=True)
class PreemptAcknowledged:
    """A worker acknowledged the preemption: a clean exit means "resumable"."""


@dataclasses.dataclass(frozen=True)
class PeerMessage:
    """A message from another node's launcher (or a link event like "lost")."""

    msg: Mapping[str, Any]


Event = Union[
    ProcessExited,
    RankExited,
    RankHung,
    RankFinished,
    RankLostPeers,
    SignalReceived,
    PreemptFileAppeared,
    JoinRequested,
    Superseded,
    PreemptListening,
    PreemptAcknowledged,
    PeerMessage,
]


# ---------------------------------------------------------------- actions
@dataclasses.dataclass(frozen=True)
class SignalGroups:
    """Send ``sig`` to each process group we started (as a terminal would)."""

    sig: int


@dataclasses.dataclass(frozen=True)
class SignalAll:
    """Send ``sig`` to our process groups and every descendant."""

    sig: int


@dataclasses.dataclass(frozen=True)
class WritePreemptSignal:
    reason: str


@dataclasses.dataclass(frozen=True)
class SendToChief:
    msg: Message


@dataclasses.dataclass(frozen=True)
class Broadcast:
    msg: Message


@dataclasses.dataclass(frozen=True)
class Log:
    text: str


Action = Union[SignalGroups, SignalAll, WritePreemptSignal, SendToChief, Broadcast, Log]


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the verdict needs to know about this node and its options."""

    role: Role
    node: int
    hosts: tuple[str, ...]
    roles: tuple[str, ...]  # "worker" or "service", one per process of the plan
    names: tuple[str, ...]  # how each process is named in the summary
    preempt_signals: tuple[int, ...]
    preempt_grace: float
    kill_after: float
    connect_timeout: float
    #: each node's name in messages, by this generation's rank: its rank in the job's
    #: first node list (``--min-nodes`` generations have fewer nodes); empty: the same
    ids: tuple[int, ...] = ()

    @property
    def host(self) -> str:
        return self.hosts[self.node]

    @property
    def me(self) -> int:
        """This node's name in messages."""
        return self.ident(self.node)

    def ident(self, node: int) -> int:
        """How messages name the node of this generation's rank ``node``."""
        return self.ids[node] if 0 <= node < len(self.ids) else node

    def addr(self, node: int) -> str:
        return self.hosts[node] if 0 <= node < len(self.hosts) else "?"
