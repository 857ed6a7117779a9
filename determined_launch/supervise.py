"""Run a ``LaunchPlan`` and stop it well: the one place that spawns processes.

Lifecycle, in three parts as in torchelastic's ``multiprocessing/api.py``:

* **start**: write the plan's private files, make this process a child
  subreaper (so grandchildren whose parent dies are re-parented to us and can
  still be found and stopped), then start each process in its own session.
* **watch**: a 50 ms loop that reads exit statuses (our children's, and the
  per-rank status files wrap_rank writes), signals, the operator's preemption
  file, and messages from the other nodes' launchers.
* **stop**: TERM every process group and every descendant, KILL what is left
  after ``kill_after`` seconds, reap everything, and print one summary line.

Decisions that involve several nodes (who failed first, whether the job was
preempted) are made by the chief's launcher and broadcast over the control
channel (``control.py``), so every node prints the same verdict and exits
with the same status.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

import psutil

from determined_launch.backends.plan import JobRuntime, LaunchPlan, ProcessSpec
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import EXIT_OK, EXIT_PREEMPTED, LaunchError

if TYPE_CHECKING:  # the control channel is imported only by multi-node jobs
    from determined_launch.control import ChiefLink, ControlLink, Message, NodeLink

logger = logging.getLogger("determined_launch.supervise")

_TICK = 0.05
#: How long the chief waits after the first failure report for earlier ones
#: still in flight from other nodes, so "first" means first in time.
_FAILURE_WINDOW = 0.5
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
DEFAULT_PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Forwarded to every process group without changing the job's state.
_FORWARDED_SIGNALS = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2, signal.SIGWINCH)


@dataclasses.dataclass(frozen=True)
class SupervisorConfig:
    """Knobs of supervision. The CLI and env (README) fill these in."""

    #: Seconds workers get to checkpoint and exit after a preemption request.
    preempt_grace: float = 30.0
    #: Seconds between TERM and KILL when stopping.
    kill_after: float = 10.0
    preempt_signals: tuple[int, ...] = DEFAULT_PREEMPT_SIGNALS
    #: Operator's preemption file (``DET_PREEMPT_FILE``): its appearance preempts.
    preempt_file: Optional[str] = None
    #: Seconds a non-chief launcher waits for the chief's, and the chief for all nodes.
    connect_timeout: float = 300.0


@dataclasses.dataclass(frozen=True)
class Failure:
    """The first thing that went wrong, as reported in the summary line."""

    status: int
    what: str
    node: int
    host: str
    time: float

    def describe(self) -> str:
        how = describe_status(self.status)
        return f"{self.what} on node {self.node} ({self.host}) {how}"

    def to_message(self) -> Message:
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, msg: Mapping[str, Any]) -> Optional[Failure]:
        try:
            return cls(
                status=int(msg["status"]),
                what=str(msg["what"]),
                node=int(msg["node"]),
                host=str(msg["host"]),
                time=float(msg["time"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


def describe_status(status: int) -> str:
    if status > 128:
        try:
            return f"was killed by {signal.Signals(status - 128).name} (status {status})"
        except ValueError:
            pass
    return f"exited with status {status}"


def exit_status_of(returncode: int) -> int:
    """Popen's ``-N`` for "killed by signal N" becomes the shell's ``128+N``."""
    return 128 - returncode if returncode < 0 else returncode


class Phase(enum.Enum):
    RUNNING = "running"
    PREEMPTING = "preempting"  # grace period: workers may checkpoint and exit
    STOPPING = "stopping"  # TERM sent, KILL pending
    DRAINING = "draining"  # local work done, waiting for the chief's verdict
    DONE = "done"


def _libc_prctl() -> Optional[Callable[..., int]]:
    """libc's ``prctl``, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: it costs a few ms of every launcher's start-up

    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


def become_subreaper(prctl: Optional[Callable[..., int]]) -> bool:
    """Adopt orphaned descendants (Linux >= 3.4), so none can escape ``stop``."""
    return prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def write_private_file(path: str, content: str, mode: int = 0o600) -> None:
    """Write atomically (temp file + rename) so no reader sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Supervisor:
    """Runs one node's plan until the job ends; ``run()`` returns the exit status."""

    def __init__(
        self,
        plan: LaunchPlan,
        info: ClusterInfo,
        runtime: JobRuntime,
        config: SupervisorConfig = SupervisorConfig(),
    ) -> None:
        self.plan = plan
        self.info = info
        self.runtime = runtime
        self.config = config
        self.host = info.container_addrs[info.container_rank]
        self.node = info.container_rank
        self.procs: list[tuple[ProcessSpec, subprocess.Popen[bytes]]] = []
        self.phase = Phase.RUNNING
        self.failure: Optional[Failure] = None  # the job's verdict
        self.pending_failures: list[Failure] = []  # chief: reports inside the window
        self.failure_window_ends = 0.0
        self.preempt_deadline: Optional[float] = None
        self.kill_deadline: Optional[float] = None
        self.stop_reason: Optional[str] = None
        self.node_results: dict[int, int] = {}  # chief: node -> 0 or EXIT_PREEMPTED
        self.final_status: Optional[int] = None
        self.seen_status_files: set[str] = set()
        self.signals: collections.deque[int] = collections.deque()
        self.chief_link: Optional[ChiefLink] = None
        self.node_link: Optional[NodeLink] = None
        self.exited: set[int] = set()  # pids whose exit has been handled
        self.drain_deadline = float("inf")
        self._prctl: Optional[Callable[..., int]] = None
        self.started_at = time.monotonic()

    @property
    def link(self) -> Optional[ControlLink]:
        return self.chief_link or self.node_link

    # ------------------------------------------------------------------ start
    def run(self) -> int:
        old_handlers = self._install_signal_handlers()
        try:
            self._prepare_files()
            self._prctl = _libc_prctl()
            become_subreaper(self._prctl)
            self._open_control_link()
            self._start_processes()
            return self._watch()
        finally:
            self._stop_everything(immediately=False)
            if self.link is not None:
                self.link.close()
            self._restore_signal_handlers(old_handlers)

    def _prepare_files(self) -> None:
        for d in (self.runtime.job_dir, self.runtime.status_dir, self.runtime.ipc_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        for f in self.plan.files:
            write_private_file(f.path, f.content, f.mode)

    def _open_control_link(self) -> None:
        if self.info.single_node:
            return
        from determined_launch.control import ChiefLink, NodeLink

        secret = self.runtime.secret or ""
        if self.info.is_chief:
            self.chief_link = ChiefLink(
                self.info.chief_ip, self.runtime.control_port, self.info.num_nodes, secret
            )
        else:
            self.node_link = NodeLink(
                self.info.chief_ip,
                self.runtime.control_port,
                self.node,
                secret,
                self.config.connect_timeout,
            )

    def _process_env(self, spec: ProcessSpec) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in self.plan.unset_env}
        env.update(self.plan.env)
        env.update(spec.env)
        return env

    def _start_processes(self) -> None:
        # SLURM delivers `scancel --signal=USR1` to every process of the step,
        # not just to us. Children start with the non-TERM preemption signals
        # ignored (SIG_IGN survives exec; wrap_rank does not forward ignored
        # signals), so only the launcher reacts, and the workers checkpoint
        # instead of dying. TERM keeps its default: it is also how we stop.
        ignored = [
            s for s in self.config.preempt_signals if s not in (signal.SIGTERM, signal.SIGINT)
        ]

        prctl = self._prctl
        launcher_pid = os.getpid()

        def prepare_child() -> None:  # in the child, between fork and exec
            for sig in ignored:
                signal.signal(sig, signal.SIG_IGN)
            # If the launcher is killed outright (OOM killer, kill -9), its
            # children get TERM and stop their own workers, instead of
            # running on as orphans; the check closes the race with a
            # launcher that died before the prctl.
            if prctl is not None:
                prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
                if os.getppid() != launcher_pid:
                    os._exit(128 + signal.SIGTERM)

        for spec in self.plan.processes:
            try:
                proc = subprocess.Popen(
                    list(spec.argv),
                    env=self._process_env(spec),
                    start_new_session=True,
                    preexec_fn=prepare_child,
                )
            except OSError as e:
                raise LaunchError(f"cannot start {spec.name} ({spec.argv[0]}): {e}") from None
            self.procs.append((spec, proc))

    # ------------------------------------------------------------------ watch
    def _watch(self) -> int:
        while self.final_status is None:
            # Sleep until the next tick, or until a signal arrives (SIGCHLD
            # included), so a worker's exit is seen at once, not a tick later.
            select.select([self._wake_r], [], [], _TICK)
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            self._handle_signals()
            self._handle_messages()
            self._check_status_files()
            self._check_processes()
            self._check_preempt_file()
            self._check_deadlines()
        return self.final_status

    def _install_signal_handlers(self) -> dict[int, Any]:
        old: dict[int, Any] = {}
        wanted = set(self.config.preempt_signals) | {signal.SIGINT} | set(_FORWARDED_SIGNALS)
        for sig in wanted:
            old[sig] = signal.signal(sig, lambda signum, _frame: self.signals.append(signum))
        old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(wake_w, False)
        self._old_wakeup_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self._wake_w = wake_w
        return old

    def _restore_signal_handlers(self, old: dict[int, Any]) -> None:
        signal.set_wakeup_fd(self._old_wakeup_fd)
        os.close(self._wake_r)
        os.close(self._wake_w)
        for sig, handler in old.items():
            signal.signal(sig, handler)

    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.popleft()
            if sig in self.config.preempt_signals:
                if self.phase == Phase.PREEMPTING:
                    self._begin_stop(f"second {signal.Signals(sig).name} during preemption")
                else:
                    self._request_preemption(f"{signal.Signals(sig).name} received")
            elif sig == signal.SIGINT:
                self._signal_groups(signal.SIGINT)
                self._begin_stop("interrupted (SIGINT)")
            else:
                self._signal_groups(sig)

    def _handle_messages(self) -> None:
        if self.link is None:
            return
        inbox = self.link.inbox
        while inbox:
            msg = inbox.popleft()
            kind = msg.get("type")
            if self.info.is_chief:
                self._chief_message(kind, msg)
            else:
                self._node_message(kind, msg)
        if self.info.is_chief:
            self._decide_failure_if_due()
            self._check_connect_timeout()

    def _chief_message(self, kind: Any, msg: Message) -> None:
        node = int(msg.get("node", -1))
        if kind == "failed":
            failure = Failure.from_message(msg)
            if failure is not None:
                self._note_failure(failure)
        elif kind == "lost":
            if node not in self.node_results:
                self._note_failure(
                    Failure(1, f"the launcher of node {node}", node, self._addr(node), time.time())
                )
        elif kind == "preempt":
            self._request_preemption(f"preemption requested on node {node}")
        elif kind == "done":
            self.node_results[node] = int(msg.get("status", 1))
            self._maybe_finish_chief()

    def _node_message(self, kind: Any, msg: Message) -> None:
        if kind == "abort":
            failure = Failure.from_message(msg.get("failure") or {})
            self.failure = failure or self.failure
            self._begin_stop("the chief stopped the job")
            if self.phase in (Phase.DRAINING, Phase.DONE) or self._all_exited():
                self._finish(self.failure.status if self.failure else 1)
        elif kind == "preempt":
            self._begin_preemption("preemption requested by the chief")
        elif kind == "finish":
            status = int(msg.get("status", 1))
            if self.phase != Phase.DRAINING and status == EXIT_OK:
                # A services-only node (ssh mode) ends with the chief's job.
                self._begin_stop("the job finished on the chief")
            self._finish(status, wait_for_processes=True)
        elif kind == "lost":
            if self.phase == Phase.DRAINING and self.final_status is None:
                self._finish(1 if self.failure is None else self.failure.status)
            elif self.phase != Phase.DONE:
                self._note_failure(
                    Failure(1, "the chief's launcher", 0, self.info.chief_ip, time.time())
                )

    def _check_status_files(self) -> None:
        try:
            names = os.listdir(self.runtime.status_dir)
        except OSError:
            return
        for name in sorted(names):
            if name in self.seen_status_files or not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.runtime.status_dir, name), encoding="utf-8") as f:
                    record = json.load(f)
            except (OSError, ValueError):
                continue  # being written (writers rename atomically, but be lenient)
            self.seen_status_files.add(name)
            status = record.get("exit_status")
            if isinstance(status, int) and status != 0 and self.phase in (
                Phase.RUNNING,
                Phase.PREEMPTING,
            ):
                self._note_failure(
                    Failure(
                        status,
                        f"rank {record.get('rank')}",
                        self.node,
                        self.host,
                        float(record.get("time", time.time())),
                    )
                )

    def _check_processes(self) -> None:
        for spec, proc in self.procs:
            returncode = proc.poll()
            if returncode is None or proc.pid in self.exited:
                continue
            self.exited.add(proc.pid)
            status = exit_status_of(returncode)
            if self.phase not in (Phase.RUNNING, Phase.PREEMPTING):
                continue
            if status != 0:
                self._note_failure(Failure(status, spec.name, self.node, self.host, time.time()))
            elif spec.role == "service" and not self._workers_done():
                self._note_failure(
                    Failure(1, f"{spec.name} (a service) exited early", self.node, self.host,
                            time.time())
                )
        if self.phase == Phase.STOPPING and self._all_exited() and self.failure is not None:
            if self.info.is_chief or self.link is None or self.final_status is not None:
                self._finish(self.failure.status)
            else:
                # Wait briefly for the chief's verdict on which rank failed first.
                self.phase = Phase.DRAINING
                self.drain_deadline = time.monotonic() + 3.0
        elif self.phase in (Phase.RUNNING, Phase.PREEMPTING) and self._workers_done():
            self._on_local_success()

    def _check_preempt_file(self) -> None:
        path = self.config.preempt_file
        if path and self.phase == Phase.RUNNING and os.path.exists(path):
            self._request_preemption(f"preemption file {path} appeared")

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        if self.phase == Phase.PREEMPTING and self.preempt_deadline and now > self.preempt_deadline:
            self.failure = self.failure or Failure(
                128 + signal.SIGTERM,
                f"workers (preemption grace period of {self.config.preempt_grace:g}s expired)",
                self.node,
                self.host,
                time.time(),
            )
            self._begin_stop("preemption grace period expired")
        if self.phase == Phase.STOPPING and self.kill_deadline and now > self.kill_deadline:
            self._signal_everything(signal.SIGKILL)
            self.kill_deadline = now + 1.0
        if self.phase == Phase.DRAINING and now > self.drain_deadline:
            self._finish(self.failure.status if self.failure else 1)

    def _check_connect_timeout(self) -> None:
        if self.chief_link is None or self.phase != Phase.RUNNING:
            return
        if time.monotonic() - self.started_at < self.config.connect_timeout:
            return
        missing = set(range(1, self.info.num_nodes)) - self.chief_link.connected_nodes
        missing -= set(self.node_results)
        if missing:
            node = min(missing)
            self._note_failure(
                Failure(
                    1,
                    f"the launcher of node {node} (never connected within "
                    f"{self.config.connect_timeout:g}s)",
                    node,
                    self._addr(node),
                    time.time(),
                )
            )

    # -------------------------------------------------------- decisions
    def _note_failure(self, failure: Failure) -> None:
        """Record a failure; the chief decides the job's first failure."""
        if self.failure is not None and self.phase not in (Phase.RUNNING, Phase.PREEMPTING):
            return
        if self.link is None:
            if self.failure is None:
                self.failure = failure
            self._begin_stop(failure.describe())
            return
        if not self.info.is_chief:
            if self.failure is None:
                self.failure = failure
                self._send({"type": "failed", **failure.to_message()})
            self._begin_stop(failure.describe())
            return
        if not self.pending_failures:
            self.failure_window_ends = time.monotonic() + _FAILURE_WINDOW
        self.pending_failures.append(failure)

    def _decide_failure_if_due(self) -> None:
        if not self.pending_failures or time.monotonic() < self.failure_window_ends:
            return
        first = min(self.pending_failures, key=lambda f: f.time)
        self.pending_failures.clear()
        if self.failure is None:
            self.failure = first
        if self.chief_link is not None:
            self.chief_link.broadcast({"type": "abort", "failure": self.failure.to_message()})
        self._begin_stop(self.failure.describe())

    def _request_preemption(self, reason: str) -> None:
        if self.phase != Phase.RUNNING:
            return
        logger.warning("det-launch: %s; asking workers to checkpoint and exit", reason)
        if self.link is not None and not self.info.is_chief:
            self._send({"type": "preempt"})
        self._begin_preemption(reason)

    def _begin_preemption(self, reason: str) -> None:
        if self.phase != Phase.RUNNING:
            return
        self.phase = Phase.PREEMPTING
        self.preempt_deadline = time.monotonic() + self.config.preempt_grace
        write_private_file(self.runtime.preempt_signal_file, json.dumps({"reason": reason}))
        if self.chief_link is not None:
            self.chief_link.broadcast({"type": "preempt"})

    def _on_local_success(self) -> None:
        # Workers that acknowledged a preemption stopped so they can resume,
        # whether the request came through us or from Python
        # (``PreemptContext.request_preemption``).
        status = EXIT_OK
        if os.path.exists(self.runtime.preempt_ack_file):
            status = EXIT_PREEMPTED
        if self.link is None:
            self._finish(status)
        elif self.info.is_chief:
            self.node_results[0] = status
            self.phase = Phase.DRAINING
            self._maybe_finish_chief()
        else:
            # The chief's "finish" (or losing the chief) ends the drain.
            self._send({"type": "done", "status": status})
            self.phase = Phase.DRAINING

    def _maybe_finish_chief(self) -> None:
        if self.failure is not None or len(self.node_results) < self.info.num_nodes:
            return
        status = EXIT_PREEMPTED if EXIT_PREEMPTED in self.node_results.values() else EXIT_OK
        if self.chief_link is not None:
            self.chief_link.broadcast({"type": "finish", "status": status})
        self._finish(status)

    def _begin_stop(self, reason: str) -> None:
        if self.phase in (Phase.STOPPING, Phase.DONE):
            return
        if self.phase == Phase.DRAINING and self._all_exited():
            return
        self.stop_reason = self.stop_reason or reason
        self.phase = Phase.STOPPING
        self._signal_everything(signal.SIGTERM)
        self.kill_deadline = time.monotonic() + self.config.kill_after

    def _finish(self, status: int, wait_for_processes: bool = False) -> None:
        if self.final_status is not None:
            return
        if wait_for_processes:
            self._stop_everything(immediately=False)
        self.final_status = status
        self.phase = Phase.DONE
        print(f"det-launch: {self._summary(status)}", file=sys.stderr, flush=True)

    def _summary(self, status: int) -> str:
        nodes = f"{self.info.num_nodes} node{'s' if self.info.num_nodes > 1 else ''}"
        if status == EXIT_OK:
            return f"job succeeded on {nodes} (exit status 0)"
        if status == EXIT_PREEMPTED and self.failure is None:
            return (
                f"job preempted after the workers acknowledged; resumable "
                f"(exit status {EXIT_PREEMPTED})"
            )
        if self.failure is not None:
            return f"job failed: {self.failure.describe()} first; exit status {status}"
        return f"job failed: {self.stop_reason or 'unknown reason'}; exit status {status}"

    # --------------------------------------------------------------- stop
    def _workers_done(self) -> bool:
        workers = [p for s, p in self.procs if s.role == "worker"]
        return all(p.poll() is not None for p in workers) and all(
            p.returncode == 0 for p in workers
        )

    def _all_exited(self) -> bool:
        return all(p.poll() is not None for _, p in self.procs)

    def _descendants(self) -> Iterator[psutil.Process]:
        try:
            yield from psutil.Process().children(recursive=True)
        except psutil.Error:
            return

    def _signal_groups(self, sig: int) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def _signal_everything(self, sig: int) -> None:
        """Signal our process groups, then every descendant, wherever it hides
        (torchrun starts its workers in sessions of their own)."""
        self._signal_groups(sig)
        for child in self._descendants():
            try:
                child.send_signal(sig)
            except psutil.Error:
                pass

    def _stop_everything(self, immediately: bool) -> None:
        """Leave no process behind: TERM, wait, KILL, reap (adopted orphans too)."""
        if not immediately and any(True for _ in self._live_descendants()):
            self._signal_everything(signal.SIGTERM)
            deadline = time.monotonic() + self.config.kill_after
            while time.monotonic() < deadline and any(True for _ in self._live_descendants()):
                self._reap()
                time.sleep(_TICK)
        for _ in range(100):
            live = list(self._live_descendants())
            if not live:
                break
            for child in live:
                try:
                    child.kill()
                except psutil.Error:
                    pass
            self._reap()
            time.sleep(_TICK)
        self._reap()

    def _live_descendants(self) -> Iterator[psutil.Process]:
        for child in self._descendants():
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    yield child
            except psutil.Error:
                continue

    def _reap(self) -> None:
        for _, proc in self.procs:
            proc.poll()
        ours = {p.pid for _, p in self.procs}
        for child in self._descendants():
            if child.pid in ours:
                continue
            try:
                os.waitpid(child.pid, os.WNOHANG)
            except ChildProcessError:
                pass

    # ------------------------------------------------------------ helpers
    def _send(self, message: Message) -> None:
        if self.node_link is not None:
            try:
                self.node_link.send(message)
            except OSError:
                self.node_link.inbox.append({"type": "lost", "node": 0})

    def _addr(self, node: int) -> str:
        addrs: Sequence[str] = self.info.container_addrs
        return addrs[node] if 0 <= node < len(addrs) else "?"


def supervise(
    plan: LaunchPlan,
    info: ClusterInfo,
    runtime: JobRuntime,
    config: SupervisorConfig = SupervisorConfig(),
) -> int:
    """Run ``plan`` on this node and return the launcher's exit status."""
    return Supervisor(plan, info, runtime, config).run()
