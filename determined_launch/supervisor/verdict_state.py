"""The verdict's state and the transitions both of its halves use.

``Verdict`` (``verdict.py``: one node's events) and the multi-node half (``peers.py``: the
chief's and the other nodes' messages) change the same state through these few transitions
(note a failure, begin a stop or a preemption, set the result); keeping them here lets both
halves import them without importing each other. Pure, like the rest of the verdict.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Optional

from determined_launch.errors import EXIT_OK, EXIT_PREEMPTED
from determined_launch.supervisor.events import (
    _TEARDOWN_STATUSES,
    Action,
    Broadcast,
    Failure,
    Kind,
    Log,
    Phase,
    Role,
    SendToChief,
    Settings,
    SignalAll,
    WritePreemptSignal,
    message,
    pick_cause,
    signal_name,
)

#: How long the chief waits after the first failure report for earlier ones
#: still in flight from other nodes, so "first" means first in time.
FAILURE_WINDOW = 0.5
#: Between repeated KILLs of processes that are still not gone.
KILL_REPEAT = 1.0

class VerdictState:
    """One node's supervision state, its queries, and the transitions that both halves of
    the verdict use. ``result`` is the exit status once decided; ``finished`` is true when it
    is decided and every process has exited: then ``summary()`` is the line to print."""

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

    def workers_succeeded(self) -> bool:
        workers = [i for i, r in enumerate(self.s.roles) if r == "worker"]
        return all(self.worker_status.get(i) == 0 for i in workers)

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
        ours = self.stop_wall is not None and f.time >= self.stop_wall
        if ours and blamer is None:
            return
        # A stop (ours, or the framework launcher's: torchrun TERMs the other workers as soon
        # as one exits) ended a teardown that was under way: the rank that noticed lost it
        # before it died. Its own status is unknown and a stop's is never the job's; the
        # noticing rank's is. (Killed *before* anyone lost it, by the OOM killer say, it
        # keeps its own status: that death is the cause.)
        if blamer is not None and f.status in _TEARDOWN_STATUSES and (ours or f.time > blamer.time):
            f = dataclasses.replace(f, status=blamer.status, how=(
                f"failed ({blamer.what} lost its connection to it; a stop then ended "
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
