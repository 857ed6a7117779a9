"""One node's launcher loop: observe, ask the verdict, act.

Each pass of the loop (woken by a signal, SIGCHLD included, or every 50 ms)
turns what it sees into ``verdict`` events: signals, preemption files,
wrap_rank's per-rank status files, process exits and messages from the other
nodes' launchers. The verdict answers with actions, which this loop carries
out. When the verdict is finished, the loop makes sure no descendant is left,
prints the one summary line and returns the exit status.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from determined_launch import envvars
from determined_launch.backends.plan import JobRuntime, LaunchPlan, ProcessSpec
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import LaunchError
from determined_launch.supervisor import verdict as v
from determined_launch.supervisor import watchdog
from determined_launch.supervisor.config import SupervisorConfig
from determined_launch.supervisor.files import remove_leftovers, status_events, write_private_file
from determined_launch.supervisor.processes import GIVE_UP_AFTER_KILL, ProcessSet
from determined_launch.supervisor.relay import ToolOutput, labels_workers, report_tool_log
from determined_launch.supervisor.restarts import Decision, RestartJudge
from determined_launch.supervisor.signals import SignalInbox

if TYPE_CHECKING:  # the control channel is imported only by multi-node jobs
    from determined_launch.supervisor.control import ControlLink

logger = logging.getLogger("determined_launch.supervisor")

_TICK = 0.05


class Supervisor:
    """Runs one node's plan until the job ends; ``run()`` returns the exit status."""

    def __init__(
        self,
        plan: LaunchPlan,
        info: ClusterInfo,
        runtime: JobRuntime,
        config: Optional[SupervisorConfig] = None,
        restarts: Optional[RestartJudge] = None,
        deferred: frozenset[int] = frozenset(),
        members: tuple[int, ...] = (),  # nodes' names in messages (``Settings.ids``)
        joining: Optional[Callable[[], tuple[int, ...]]] = None,
        superseded: Optional[Callable[[], Optional[str]]] = None,
    ) -> None:
        config = config or SupervisorConfig()
        #: ``--min-nodes``: nodes asking to rejoin (the chief preempts for them), those it
        #: preempted for; why the run directory's claims say this generation is over
        self.joining, self.members, self.superseded = joining, members, superseded
        self._joiners: tuple[int, ...] = ()
        self._join_check_at = 0.0
        #: this generation's signals; ``deferred``: those the previous generation
        #: blocked for this one, after ``run`` those this one blocked for the next
        self.signals = SignalInbox(deferred)
        #: ``None``: restarts are off (``--max-restarts 0``) and nothing waits for a
        #: decision; a non-chief node only checks that it is set, the chief decides.
        self.restarts = restarts
        #: how this generation ends: restart or not (set by ``run``)
        self.decision = Decision(False)
        self._next: Optional[dict[str, Any]] = None  # the chief's decision, if it came early
        self.plan = plan
        self.info = info
        self.runtime = runtime
        self.config = config
        self.processes = ProcessSet()
        self.link: Optional[ControlLink] = None
        self.seen_status_files: set[str] = set()
        #: the hang watchdog and straggler check over the ranks' progress files
        self.watchdog = watchdog.Watchdog(runtime.status_dir, config.hang_timeout)
        self._term_sent_at: Optional[float] = None  # when the stop's TERM went out
        tools = tuple(p.name for p in plan.processes if p.tool and labels_workers(p.argv))
        self.tool_output: Optional[ToolOutput] = None
        if tools and not config.verbose:
            self.tool_output = ToolOutput(runtime.tool_log, tools)
        role = (
            v.Role.SINGLE if info.single_node else v.Role.CHIEF if info.is_chief else v.Role.NODE
        )
        self.verdict = v.Verdict(
            v.Settings(
                role=role,
                node=info.container_rank,
                hosts=tuple(info.container_addrs),
                roles=tuple(p.role for p in plan.processes),
                names=tuple(p.name for p in plan.processes),
                preempt_signals=tuple(config.preempt_signals),
                preempt_grace=config.preempt_grace,
                kill_after=config.kill_after,
                connect_timeout=config.connect_timeout,
                ids=members,
            ),
            now=time.monotonic(),
        )

    @property
    def deferred(self) -> frozenset[int]:
        return self.signals.deferred

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        self.signals.install(self.config.preempt_signals)
        try:
            self._prepare_files()
            self.processes.become_subreaper()
            try:
                self._open_control_link()
            except LaunchError as e:  # this generation's chief never answered: dead too?
                if self.restarts is None:
                    raise
                from determined_launch.supervisor import handoff

                self.decision = handoff.no_link(self.restarts, self.verdict.s, e)
                print(f"det-launch: {self.decision.why}", file=sys.stderr, flush=True)
                return 1
            self.processes.start(
                self.plan.processes, self._process_env, self._ignored_signals(), self.tool_output
            )
            self._watch()
            # Exit only once every process we started is gone, so the next
            # command in a script never meets this job's workers.
            self._drain_descendants()
            # Status files written just before the last exit still count.
            self._feed(self._status_files())
            status = self.verdict.result
            if status is None:  # unreachable: _watch returns only when finished
                status = 1
            self.decision = self._restart_decision(status)
            if self.decision.restart:
                print(f"det-launch: {self.decision.why}", file=sys.stderr, flush=True)
                return status
            note = ""
            if self.tool_output is not None:
                note = report_tool_log(self.tool_output, status, self.verdict.cause,
                                       self.verdict.s.me)
            if self.decision.why:
                print(f"det-launch: {self.decision.why}", file=sys.stderr, flush=True)
            print(f"det-launch: {self.verdict.summary()}{self.decision.history}{note}",
                  file=sys.stderr, flush=True)
            return status
        finally:
            self.processes.ensure_gone(self.config.kill_after)
            remove_leftovers(self.plan.leftovers)
            if self.tool_output is not None:
                self.tool_output.close()
            if self.link is not None:
                self.link.close()
            if self.decision.restart:
                self.signals.defer()
            self.signals.restore()

    def _restart_decision(self, status: int) -> Decision:
        """Whether the job restarts: the chief (or a single node) decides and
        tells the nodes; a node follows the chief (``handoff``)."""
        if self.restarts is None:
            return Decision(False)
        from determined_launch.supervisor import handoff

        cause = self.verdict.cause
        if self.link is None:
            return self.restarts.decide(status, cause, joining=self._joiners)
        if isinstance(self.link, handoff.ChiefLink):
            # A node stops within kill_after (and its KILL retries), then waits for our word.
            bound = self.config.kill_after + v.DRAIN_WAIT + GIVE_UP_AFTER_KILL + 5.0
            return handoff.chief_decides(self.link, self.restarts, status, cause, bound,
                                         self._joiners)
        # A signal meanwhile waits for the next generation (SignalInbox.defer).
        return handoff.node_decides(self.link, self.restarts, status, cause,
                                    self.verdict.chief_gone, self._next,
                                    self.config.connect_timeout, self.joining)

    def _prepare_files(self) -> None:
        for d in (self.runtime.job_dir, self.runtime.status_dir, self.runtime.ipc_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        for f in self.plan.files:
            write_private_file(f.path, f.content, f.mode)

    def _open_control_link(self) -> None:
        if self.info.single_node:
            return
        from determined_launch.supervisor.control import ChiefLink, NodeLink

        secret = self.runtime.secret or ""
        if self.info.is_chief:
            self.link = ChiefLink(
                self.info.chief_ip, self.runtime.control_port, self.info.num_nodes, secret
            )
        else:
            self.link = NodeLink(
                self.info.chief_ip,
                self.runtime.control_port,
                self.info.container_rank,
                secret,
                self.config.connect_timeout,
                num_nodes=self.info.num_nodes,
            )

    def _process_env(self, spec: ProcessSpec) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in self.plan.unset_env}
        env.update(self.plan.env)
        env.update(spec.env)
        return env

    def _ignored_signals(self) -> list[int]:
        # SLURM delivers `scancel --signal=USR1` to every process of the step,
        # not just to us. Children start with the non-TERM preemption signals
        # ignored (SIG_IGN survives exec; wrap_rank does not forward ignored
        # signals), so only the launcher reacts, and the workers checkpoint
        # instead of dying. TERM keeps its default: it is also how we stop.
        keep = (signal.SIGTERM, signal.SIGINT)
        return [s for s in self.config.preempt_signals if s not in keep]

    # ---------------------------------------------------------------- watch
    def _watch(self) -> None:
        while not self.verdict.finished:
            timeout = _TICK
            deadline = self.verdict.next_deadline()
            if deadline is not None:
                timeout = max(0.0, min(timeout, deadline - time.monotonic()))
            # Sleep until the next tick, or until a signal arrives (SIGCHLD
            # included), so a worker's exit is seen at once.
            self.signals.wait(timeout)
            self._feed(self._observe())
            self._act(self.verdict.tick(time.monotonic(), time.time()))

    def _drain_descendants(self) -> None:
        """Wait for what outlived the plan's processes (the workers of a
        framework launcher that a stop killed), still answering signals:
        TERM was sent when the stop began, KILL follows ``kill_after`` after
        it, and a second Ctrl-C or TERM kills at once. Bounded like
        ``ProcessSet.ensure_gone``: never a hang on an unkillable process."""
        deadline = (self._term_sent_at or time.monotonic()) + self.config.kill_after
        give_up: Optional[float] = None
        while self.processes.live_descendants():
            if give_up is not None and time.monotonic() > give_up:
                logger.warning("det-launch: processes still alive %gs after KILL; leaving them",
                               GIVE_UP_AFTER_KILL)
                break
            if self._term_sent_at is None:
                self.processes.signal_all(signal.SIGTERM)
                self._term_sent_at = time.monotonic()
                deadline = self._term_sent_at + self.config.kill_after
            hurry = any(s in (signal.SIGINT, signal.SIGTERM) for s in self.signals.drain())
            if hurry or time.monotonic() >= deadline:
                self.processes.signal_all(signal.SIGKILL)
                deadline = time.monotonic() + v.KILL_REPEAT
                give_up = give_up or time.monotonic() + GIVE_UP_AFTER_KILL
            self.signals.wait(_TICK)
            self.processes.reap()
        self.processes.reap()

    def _observe(self) -> list[v.Event]:
        """Everything that happened since the last pass. Acknowledgements
        come before exits, so a clean exit after one reads as "preempted"."""
        events: list[v.Event] = []
        # Facts about the workers first: a signal read in the same pass must
        # already know that they watch for preemption.
        if not self.verdict.listening and os.path.exists(self.runtime.preempt_listen_file):
            events.append(v.PreemptListening())
        if not self.verdict.acked and os.path.exists(self.runtime.preempt_ack_file):
            events.append(v.PreemptAcknowledged())
        events.extend(v.SignalReceived(s) for s in self.signals.drain())
        if self.link is not None:
            inbox = self.link.inbox
            while inbox:
                msg = inbox.popleft()
                if msg.get("type") == v.Kind.NEXT:
                    self._next = msg  # for after this generation (handoff.await_chief)
                else:
                    events.append(v.PeerMessage(msg))
        path = self.config.preempt_file
        if path and self.verdict.phase == v.Phase.RUNNING and os.path.exists(path):
            events.append(v.PreemptFileAppeared(path))
        if self.verdict.phase == v.Phase.RUNNING and time.monotonic() >= self._join_check_at:
            self._join_check_at = time.monotonic() + 1.0
            events.extend(self._claims_events())
        events.extend(self._status_files())
        if self.verdict.phase == v.Phase.RUNNING:
            events.extend(self._progress_events())
        now = time.time()
        events.extend(v.ProcessExited(i, status, now) for i, status in self.processes.poll())
        return events

    def _claims_events(self) -> list[v.Event]:
        """``--min-nodes``: a later generation claimed (this one must stop, no
        checkpoint), or nodes asking to rejoin (workers that can checkpoint)."""
        why = self.superseded() if self.superseded is not None else None
        if why is not None:
            return [v.Superseded(why)]
        if (self.joining is not None and self.info.is_chief and not self._joiners
                and self.verdict.listening):
            self._joiners = tuple(n for n in self.joining() if n not in self.members)
            if self._joiners:
                return [v.JoinRequested(self._joiners)]
        return []

    def _progress_events(self) -> list[v.Event]:
        """``--hang-timeout`` and stragglers (``watchdog``): said here, a hang for the verdict."""
        run_dir = self.plan.env.get(envvars.RUN_DIR) or os.environ.get(envvars.RUN_DIR)
        hang = self.watchdog.check(self.verdict.finished_ranks, self.verdict.s.me,
                                   self.verdict.s.host, run_dir)
        return [] if hang is None else [v.RankHung(hang.rank, hang.silent)]

    def _status_files(self) -> list[v.Event]:
        return status_events(self.runtime.status_dir, self.seen_status_files)

    def _feed(self, events: list[v.Event]) -> None:
        for event in events:
            self._act(self.verdict.handle(event, time.monotonic(), time.time()))

    def _act(self, actions: list[v.Action]) -> None:
        for action in actions:
            if isinstance(action, v.SignalAll):
                self.processes.signal_all(action.sig)
                if action.sig == signal.SIGTERM:
                    # a stopped process (SIGSTOP, a hang) takes its TERM only once continued
                    self.processes.signal_all(signal.SIGCONT)
                if action.sig == signal.SIGTERM and self._term_sent_at is None:
                    self._term_sent_at = time.monotonic()
            elif isinstance(action, v.SignalGroups):
                self.processes.signal_groups(action.sig)
            elif isinstance(action, v.WritePreemptSignal):
                write_private_file(
                    self.runtime.preempt_signal_file, json.dumps({"reason": action.reason})
                )
            elif isinstance(action, (v.SendToChief, v.Broadcast)):
                # The verdict asks a node only to send to the chief and the
                # chief only to broadcast: each link sends its one way.
                self._deliver(action.msg)
            elif isinstance(action, v.Log):
                logger.warning("det-launch: %s", action.text)

    def _deliver(self, message: dict[str, Any]) -> None:
        if self.link is None:
            return
        try:
            self.link.deliver(message)
        except OSError:
            why = "was lost (sending to it failed)"
            self.link.inbox.append(v.message(v.Kind.LOST, node=0, why=why))


def supervise(
    plan: LaunchPlan,
    info: ClusterInfo,
    runtime: JobRuntime,
    config: Optional[SupervisorConfig] = None,
) -> int:
    """Run ``plan`` on this node and return the launcher's exit status."""
    return Supervisor(plan, info, runtime, config).run()
