"""The supervisor's decisions as a pure state machine: events in, actions out.

Nothing here touches a process, a file, a socket or the clock. The node loop
(``node.py``) turns what it observes into events, calls ``Verdict.handle``
and ``Verdict.tick`` with the current time, and carries out the actions
they return. That split is what makes the hard questions testable one event
order at a time:

* *Who failed first?* Every failure report carries the wall-clock time the
  failure happened. The verdict is the earliest **genuine** failure: one
  that happened before we began to stop the job. A worker that dies after
  our TERM or KILL (or after torchrun's own teardown, which follows the
  first failure) never becomes the verdict while a genuine one is known.
* *When do we exit?* Only when a result is decided **and** every process we
  started has exited. Every phase other than ``RUNNING`` (where we wait for
  the user's job itself) waits on something with a deadline: the grace
  period, the KILL deadline (repeated until the processes are gone), the
  chief's verdict, or a peer launcher whose heartbeat is watched.
* *Interrupted or failed?* SIGINT (and a preemption signal when no worker
  listens for preemption) stops the job with ``128 + signal``; it is a
  *stop cause*, ranked below any genuine failure.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Optional

from determined_launch.errors import EXIT_HUNG, EXIT_OK, EXIT_PREEMPTED
from determined_launch.supervisor import peers
from determined_launch.supervisor.events import (
    _TEARDOWN_STATUSES,
    Action,
    Broadcast,
    Event,
    Failure,
    JoinRequested,
    Kind,
    Log,
    PeerMessage,
    Phase,
    PreemptAcknowledged,
    PreemptFileAppeared,
    PreemptListening,
    ProcessExited,
    RankExited,
    RankFinished,
    RankHung,
    RankLostPeers,
    Role,
    SendToChief,
    Settings,
    SignalAll,
    SignalGroups,
    SignalReceived,
    Superseded,
    WritePreemptSignal,
    describe_status,
    message,
    pick_cause,
    signal_name,
)

#: How long the chief waits after the first failure report for earlier ones
#: still in flight from other nodes, so "first" means first in time.
FAILURE_WINDOW = 0.5
#: How long a non-chief node whose processes are gone waits for the chief's
#: verdict before it exits with what it knows.
DRAIN_WAIT = 3.0
#: Between repeated KILLs of processes that are still not gone.
KILL_REPEAT = 1.0
#: The same stop or preemption signal again within this is one request, not a
#: second: Linux re-sends the parent-death signal as each thread of a
#: multi-threaded parent exits (a SIGKILLed det-launch experiment worker gave
#: its trial's launcher two TERMs, and the second cut the trial's checkpoint).
DUPLICATE_SIGNAL = 0.25


class Verdict:
    """One node's supervision state. ``handle``/``tick`` return actions.

    ``result`` is the exit status once decided; ``finished`` is true when it
    is decided and every process has exited: then ``summary()`` is the line
    to print.
    """

    def __init__(self, settings: Settings, now: float) -> None:
        self.s = settings
        self.phase = Phase.RUNNING
        self.started_at = now
        self.alive = set(range(len(settings.roles)))
        self.worker_status: dict[int, int] = {}
        self.finished_ranks: set[int] = set()  # their core.init() exited cleanly
        self.lost_peers: dict[int, tuple[int, ...]] = {}  # rank -> the peers it lost
        self.candidates: list[Failure] = []
        self.chief_cause: Optional[Failure] = None  # node: the chief's verdict
        self.chief_failures = 0  # node: genuine failures the chief counted
        self.decided_cause: Optional[Failure] = None  # chief: frozen once broadcast
        self.result: Optional[int] = None
        self.stop_wall: Optional[float] = None  # wall time the stop began
        self.kill_at: Optional[float] = None
        self.preempt_at: Optional[float] = None
        self.window_ends: Optional[float] = None  # chief: failure window
        self.drain_until: Optional[float] = None
        self.listening = False
        self.acked = False
        self.chief_gone = False
        self.connected: set[int] = set()
        self.node_results: dict[int, int] = {}
        self.stop_reason: Optional[str] = None
        self.connect_checked = settings.role != Role.CHIEF
        #: single node: the result is the cause's status and may still be
        #: revised by a late report of an earlier genuine failure
        self.result_from_cause = False
        self.last_signal: Optional[tuple[int, float]] = None  # (signal, when) of the last one

    # -------------------------------------------------------------- queries
    @property
    def finished(self) -> bool:
        return self.result is not None and not self.alive

    @property
    def cause(self) -> Optional[Failure]:
        if self.decided_cause is not None:
            return self.decided_cause
        if self.chief_cause is not None:
            return self.chief_cause
        return pick_cause(self.candidates)

    def next_deadline(self) -> Optional[float]:
        """The earliest time at which ``tick`` will act, or None."""
        times = [
            t
            for t in (self.kill_at, self.preempt_at, self.window_ends, self.drain_until)
            if t is not None
        ]
        if not self.connect_checked and self.phase == Phase.RUNNING:
            times.append(self.started_at + self.s.connect_timeout)
        return min(times) if times else None

    def waiting_on_peer(self) -> bool:
        """Waiting for another launcher, whose silence the link turns into "lost"."""
        return self.phase == Phase.DRAINING and self.s.role != Role.SINGLE and not self.chief_gone

    def genuine_failures(self) -> int:
        """How many failed, for the summary: ranks if ranks reported, else processes.

        Deaths by the signals a teardown sends (torchrun stops the other
        ranks after the first failure) are not counted, unless the verdict.
        """
        if self.s.role == Role.NODE and self.chief_cause is not None:
            return self.chief_failures
        cause = self.cause
        genuine = [
            f for f in self.candidates
            if not f.interrupt and (f == cause or f.status not in _TEARDOWN_STATUSES)
        ]
        ranks = {(f.node, f.what) for f in genuine if f.what.startswith("rank ")}
        return len(ranks) if ranks else len(genuine)

    def summary(self) -> str:
        status = self.result
        nodes = f"{len(self.s.hosts)} node{'s' if len(self.s.hosts) > 1 else ''}"
        cause = self.cause
        if status == EXIT_OK:
            return f"job succeeded on {nodes} (exit status 0)"
        if status == EXIT_PREEMPTED and cause is None:
            return (
                f"job preempted after the workers acknowledged; resumable "
                f"(exit status {EXIT_PREEMPTED})"
            )
        if cause is not None and cause.interrupt:
            return f"job stopped: {cause.describe()}; exit status {status}"
        if cause is not None:
            n = self.genuine_failures()
            more = f" ({n} ranks failed)" if n > 1 else ""
            return f"job failed: {cause.describe()} first{more}; exit status {status}"
        return f"job failed: {self.stop_reason or 'unknown reason'}; exit status {status}"

    # --------------------------------------------------------------- events
    def handle(self, event: Event, now: float, wall: float) -> list[Action]:
        out: list[Action] = []
        if isinstance(event, ProcessExited):
            self._process_exited(event, now, wall, out)
        elif isinstance(event, RankHung):
            if self.phase == Phase.RUNNING:
                how = f"hung: no progress for {event.silent:.0f} s"
                self.note(Failure(EXIT_HUNG, f"rank {event.rank}", self.s.me, self.s.host, wall,
                                  how=how), now, wall, out)
        elif isinstance(event, RankFinished):
            self.finished_ranks.add(event.rank)
        elif isinstance(event, RankLostPeers):
            self.lost_peers.setdefault(event.rank, event.peers)
        elif isinstance(event, RankExited):
            if event.status != 0:
                self.note(self._rank_failure(event), now, wall, out)
        elif isinstance(event, SignalReceived):
            self._signal(event.sig, now, wall, out)
        elif isinstance(event, PreemptFileAppeared):
            self.request_preemption(f"saw the preemption file {event.path}", None, now, wall, out)
        elif isinstance(event, JoinRequested):
            who = ", ".join(map(str, event.nodes))
            self.request_preemption(f"makes room for node {who} (rejoining)", None, now, wall, out)
        elif isinstance(event, Superseded):
            self._interrupt(signal.SIGTERM, f"stopped its generation: {event.why}", now, wall, out)
        elif isinstance(event, PreemptListening):
            self.listening = True
        elif isinstance(event, PreemptAcknowledged):
            self.acked = True
        elif isinstance(event, PeerMessage):
            if self.s.role == Role.CHIEF:
                peers.chief_message(self, event.msg, now, wall, out)
            elif self.s.role == Role.NODE:
                peers.node_message(self, event.msg, now, wall, out)
        self._progress(now, wall, out)
        return out

    def tick(self, now: float, wall: float) -> list[Action]:
        """Act on deadlines that have passed."""
        out: list[Action] = []
        if self.window_ends is not None and now >= self.window_ends:
            peers.decide(self, now, wall, out)
        grace_over = self.preempt_at is not None and now >= self.preempt_at
        if self.phase == Phase.PREEMPTING and grace_over:
            self.preempt_at = None
            grace = f"{self.s.preempt_grace:g}s"
            self.note(
                Failure(128 + signal.SIGTERM, "workers", self.s.me, self.s.host, wall,
                        how=f"did not stop within the preemption grace period of {grace}",
                        interrupt=True),
                now, wall, out,
            )
        if self.kill_at is not None and now >= self.kill_at and self.alive:
            out.append(SignalAll(signal.SIGKILL))
            self.kill_at = now + KILL_REPEAT
        if self.drain_until is not None and now >= self.drain_until and self.result is None:
            self.drain_until = None
            self.set_result(self.local_status())
        if not self.connect_checked and self.phase == Phase.RUNNING:
            peers.check_connected(self, now, wall, out)
        self._progress(now, wall, out)
        return out

    # ------------------------------------------------------------ internals
    def _rank_failure(self, e: RankExited) -> Failure:
        how = None
        if e.rank in self.finished_ranks:  # its work was done: say so
            how = (f"had finished its work (core.init() exited cleanly) and then "
                   f"{describe_status(e.status)}")
        blames = tuple(f"rank {p}" for p in self.lost_peers.get(e.rank, ()))
        return Failure(e.status, f"rank {e.rank}", self.s.me, self.s.host, e.time, how=how,
                       blames=blames)

    def _process_exited(self, e: ProcessExited, now: float, wall: float, out: list[Action]) -> None:
        if e.index not in self.alive:
            return
        self.alive.discard(e.index)
        role = self.s.roles[e.index]
        if role == "worker":
            self.worker_status[e.index] = e.status
        if e.status != 0:
            self.note(Failure(e.status, self.s.names[e.index], self.s.me, self.s.host, e.time),
                       now, wall, out)
        elif role == "service" and not self.workers_succeeded() and self.phase in (
            Phase.RUNNING, Phase.PREEMPTING
        ):
            self.note(Failure(1, self.s.names[e.index], self.s.me, self.s.host, e.time,
                               how="(a service) exited early"), now, wall, out)

    def workers_succeeded(self) -> bool:
        workers = [i for i, r in enumerate(self.s.roles) if r == "worker"]
        return all(self.worker_status.get(i) == 0 for i in workers)

    def _signal(self, sig: int, now: float, wall: float, out: list[Action]) -> None:
        if sig in (signal.SIGINT, signal.SIGTERM, *self.s.preempt_signals):
            last, self.last_signal = self.last_signal, (sig, now)
            if last is not None and last[0] == sig and now - last[1] < DUPLICATE_SIGNAL:
                return
        stopping = self.phase in (Phase.STOPPING, Phase.DONE) or (
            self.phase == Phase.DRAINING
            and (self.result is not None or self.drain_until is not None)
        )
        if sig in (signal.SIGINT, signal.SIGTERM) and stopping:
            # A second Ctrl-C (or TERM) while stopping: no more patience.
            if self.alive:
                out.append(SignalAll(signal.SIGKILL))
                self.kill_at = now + KILL_REPEAT
            return
        if sig in self.s.preempt_signals:
            if self.phase == Phase.PREEMPTING:
                self._interrupt(sig, f"received a second {signal_name(sig)} during preemption", now,
                                wall, out)
            else:
                self.request_preemption(f"received {signal_name(sig)}", sig, now, wall, out)
        elif sig in (signal.SIGINT, signal.SIGTERM):
            out.append(SignalGroups(sig))
            self._interrupt(sig, None, now, wall, out)
        else:
            out.append(SignalGroups(sig))

    def _interrupt(
        self, sig: int, how: Optional[str], now: float, wall: float, out: list[Action]
    ) -> None:
        how = how or f"was interrupted by {signal_name(sig)}"
        self.note(Failure(128 + sig, "the launcher", self.s.me, self.s.host, wall, how=how,
                           interrupt=True), now, wall, out)
        # From here on deaths are ours (we forward the signal), even while the
        # chief still waits out its failure window before stopping.
        if self.stop_wall is None:
            self.stop_wall = wall

    def request_preemption(
        self, reason: str, sig: Optional[int], now: float, wall: float, out: list[Action]
    ) -> None:
        if self.phase != Phase.RUNNING:
            return
        if not self.listening:
            # Nothing on this node watches for preemption (a plain script):
            # waiting a grace period would only delay the same stop.
            how = f"{reason}; no worker watches for preemption, so the job stopped at once"
            self._interrupt(sig or signal.SIGTERM, how, now, wall, out)
            return
        out.append(Log(f"the launcher {reason}; asking workers to checkpoint and exit"))
        if self.s.role == Role.NODE:
            out.append(SendToChief(message(Kind.PREEMPT)))
        self.begin_preemption(reason, now, out)

    def begin_preemption(self, reason: str, now: float, out: list[Action]) -> None:
        if self.phase != Phase.RUNNING:
            return
        self.phase = Phase.PREEMPTING
        self.preempt_at = now + self.s.preempt_grace
        out.append(WritePreemptSignal(reason))
        if self.s.role == Role.CHIEF:
            out.append(Broadcast(message(Kind.PREEMPT)))

    def note(self, f: Failure, now: float, wall: float, out: list[Action]) -> None:
        """A failure (or interruption) report; deaths after our stop are ours,
        except a rank's that another rank lost before the stop: it was dying
        already (its teardown outlasted the stop's start)."""
        blamer = next((c for c in self.candidates if not c.interrupt and f.what in c.blames),
                      None)
        if self.stop_wall is not None and f.time >= self.stop_wall:
            if blamer is None:
                return
            if f.status in _TEARDOWN_STATUSES:  # our stop ended its teardown: its own status
                # is unknown, and ours is never the job's; the rank that noticed has one
                f = dataclasses.replace(f, status=blamer.status, how=(
                    f"failed ({blamer.what} lost its connection to it; our stop then ended "
                    f"it, status {f.status})"))
        if self.decided_cause is not None or self.chief_cause is not None:
            return
        if self.result is not None and not self.result_from_cause:
            return
        if f.interrupt and any(c.interrupt for c in self.candidates):
            return  # the first interruption is the one that counts
        self.candidates.append(f)
        if self.result_from_cause:
            # A report that arrived late (a status file read after the last
            # exit) but happened before the stop may still be the first.
            self.result = self.local_status()
        if self.s.role == Role.SINGLE:
            self.begin_stop(f.describe(), now, wall, out)
        elif self.s.role == Role.NODE:
            out.append(SendToChief(message(Kind.FAILED, **f.to_message())))
            self.begin_stop(f.describe(), now, wall, out)
        elif self.window_ends is None:
            self.window_ends = now + FAILURE_WINDOW

    def begin_stop(self, reason: str, now: float, wall: float, out: list[Action]) -> None:
        if self.phase in (Phase.STOPPING, Phase.DONE):
            return
        self.stop_reason = self.stop_reason or reason
        self.phase = Phase.STOPPING
        self.preempt_at = None
        if self.stop_wall is None:
            self.stop_wall = wall
        if self.alive:
            out.append(SignalAll(signal.SIGTERM))
            self.kill_at = now + self.s.kill_after

    def local_status(self) -> int:
        cause = self.cause
        if cause is not None:
            return cause.status
        return 1 if self.stop_reason else EXIT_OK

    def set_result(self, status: int) -> None:
        if self.result is None:
            self.result = status

    def _progress(self, now: float, wall: float, out: list[Action]) -> None:
        """Move on when the workers are done, or when everything has exited."""
        if self.phase in (Phase.RUNNING, Phase.PREEMPTING) and self.workers_succeeded():
            peers.local_success(self, now, wall, out)
        if self.s.role == Role.NODE and self.chief_gone and self.phase == Phase.DRAINING:
            self.set_result(self.local_status())
        if self.s.role == Role.CHIEF and self.phase == Phase.DRAINING and self.result is None:
            if len(self.node_results) >= len(self.s.hosts):
                status = EXIT_PREEMPTED if EXIT_PREEMPTED in self.node_results.values() else 0
                out.append(Broadcast(message(Kind.FINISH, status=status)))
                self.set_result(status)
                self.begin_stop("the job finished", now, wall, out)
        if self.phase == Phase.STOPPING and not self.alive and self.result is None:
            if self.s.role == Role.NODE and self.chief_cause is None and not self.chief_gone:
                # Wait briefly for the chief's word on which rank failed first.
                self.phase = Phase.DRAINING
                self.drain_until = now + DRAIN_WAIT
            elif self.s.role != Role.CHIEF or self.decided_cause is not None or not self.candidates:
                self.set_result(self.local_status())
                self.result_from_cause = self.s.role == Role.SINGLE
        if self.result is not None and self.alive and self.phase != Phase.STOPPING:
            self.begin_stop("the job's result is decided", now, wall, out)
        if self.finished:
            self.phase = Phase.DONE
            self.kill_at = self.preempt_at = self.drain_until = self.window_ends = None


