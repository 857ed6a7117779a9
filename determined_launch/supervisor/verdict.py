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

import signal

from determined_launch.errors import EXIT_HUNG, EXIT_PREEMPTED
from determined_launch.supervisor import peers

# names node.py and the tests read through this module (``verdict.Settings``, ...)
from determined_launch.supervisor.events import (  # noqa: F401
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
from determined_launch.supervisor.verdict_state import (  # noqa: F401  (their old home)
    FAILURE_WINDOW,
    KILL_REPEAT,
    VerdictState,
)

#: How long a non-chief node whose processes are gone waits for the chief's
#: verdict before it exits with what it knows.
DRAIN_WAIT = 3.0
#: The same stop or preemption signal again within this is one request, not a
#: second: Linux re-sends the parent-death signal as each thread of a
#: multi-threaded parent exits (a SIGKILLed det-launch experiment worker gave
#: its trial's launcher two TERMs, and the second cut the trial's checkpoint).
DUPLICATE_SIGNAL = 0.25


class Verdict(VerdictState):
    """One node's supervision: ``handle``/``tick`` turn events and deadlines into actions
    (the state and its shared transitions: ``verdict_state.py``)."""

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


