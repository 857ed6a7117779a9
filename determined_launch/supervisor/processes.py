"""The processes of one node's plan: start, poll, signal, reap. Nothing else
in the project starts or kills a process.

Each process starts in its own session (so a signal to its group reaches
what it started), with a parent-death TERM (a SIGKILLed launcher leaves no
orphans), and this launcher is a child subreaper, so descendants whose
parent dies are re-parented to us and can still be found and stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Optional

import psutil

from determined_launch.backends.plan import ProcessSpec
from determined_launch.errors import LaunchError
from determined_launch.supervisor.relay import ToolOutput

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
_POLL = 0.05
#: Seconds of repeated KILLs after which a process that still lives (stuck
#: in the kernel, uninterruptible) is left behind rather than hang the launcher.
GIVE_UP_AFTER_KILL = 5.0


def exit_status_of(returncode: int) -> int:
    """Popen's ``-N`` for "killed by signal N" becomes the shell's ``128+N``."""
    return 128 - returncode if returncode < 0 else returncode


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


class ProcessSet:
    """The plan's processes, in plan order; ``poll()`` reports each exit once."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        #: framework launchers (``ProcessSpec.tool``): signals go to their
        #: workers, not to them; a stop kills them (``signal_all``)
        self.tool_pids: set[int] = set()
        self._reported: set[int] = set()
        self._prctl = _libc_prctl()
        #: processes this process already had: never ours to stop or reap (a program that runs
        #: a Supervisor in-process, a test with its storage servers, keeps its own children)
        self._theirs = {p.pid for p in _children_of_me()}

    def become_subreaper(self) -> bool:
        """Adopt orphaned descendants (Linux >= 3.4), so none can escape ``stop``."""
        return self._prctl is not None and self._prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

    def start(
        self,
        specs: Sequence[ProcessSpec],
        env_for: Callable[[ProcessSpec], Mapping[str, str]],
        ignored_signals: Sequence[int],
        relay: Optional[ToolOutput] = None,
    ) -> None:
        """Start ``specs`` in order; with ``relay``, framework launchers'
        output goes through it (their own lines to its log)."""
        prctl = self._prctl
        launcher_pid = os.getpid()

        def prepare_child() -> None:  # in the child, between fork and exec
            for sig in ignored_signals:
                signal.signal(sig, signal.SIG_IGN)
            # If the launcher is killed outright (OOM killer, kill -9), its
            # children get TERM and stop their own workers; the getppid
            # check closes the race with a launcher that died before prctl.
            if prctl is not None:
                prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
                if os.getppid() != launcher_pid:
                    os._exit(128 + signal.SIGTERM)

        for spec in specs:
            relayed = relay is not None and spec.tool and spec.name in relay.tool_names
            ends = relay.pipes() if relay is not None and relayed else (None, None)
            try:
                proc = subprocess.Popen(
                    list(spec.argv),
                    env=dict(env_for(spec)),
                    start_new_session=True,
                    preexec_fn=prepare_child,
                    stdout=ends[0],
                    stderr=ends[1],
                )
            except OSError as e:
                raise LaunchError(f"cannot start {spec.name} ({spec.argv[0]}): {e}") from None
            finally:
                for fd in ends:
                    if fd is not None:
                        os.close(fd)  # the tool has its copies; EOF comes when all are gone
            self.procs.append(proc)
            if spec.tool:
                self.tool_pids.add(proc.pid)

    def poll(self) -> list[tuple[int, int]]:
        """``(index, exit status)`` of processes that exited since the last call."""
        out = []
        for i, proc in enumerate(self.procs):
            if i in self._reported:
                continue
            returncode = proc.poll()
            if returncode is not None:
                self._reported.add(i)
                out.append((i, exit_status_of(returncode)))
        return out

    def signal_groups(self, sig: int) -> None:
        """Deliver ``sig`` as a terminal would: to each process group we
        started, and for a framework launcher to its workers instead (torchrun
        turns a signal into a traceback and a second of teardown)."""
        for proc in self.procs:
            if proc.poll() is not None:
                continue
            if proc.pid in self.tool_pids:
                self._signal_tree(proc.pid, sig)
                continue
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def signal_all(self, sig: int) -> None:
        """Our process groups, then every descendant wherever it hides
        (torchrun starts its workers in sessions of their own).

        A stop (TERM) kills framework launchers outright, after their
        workers got the TERM: we stop the workers ourselves, and a
        launcher's own teardown adds a second and a traceback, nothing more.
        """
        self.signal_groups(sig)
        for child in self._descendants():
            own = sig
            if child.pid in self.tool_pids and sig == signal.SIGTERM:
                own = signal.SIGKILL
            try:
                child.send_signal(own)
            except psutil.Error:
                pass

    def _signal_tree(self, pid: int, sig: int) -> None:
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                child.send_signal(sig)
            except psutil.Error:
                pass

    def _descendants(self) -> Iterator[psutil.Process]:
        """Every descendant but those of the processes that were here before us."""
        for child in _children_of_me():
            if not self._theirs:
                yield child
                continue
            try:
                line = {child.pid, *(p.pid for p in child.parents())}
            except psutil.Error:
                continue
            if not line & self._theirs:
                yield child

    def live_descendants(self) -> list[psutil.Process]:
        live = []
        for child in self._descendants():
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    live.append(child)
            except psutil.Error:
                continue
        return live

    def reap(self) -> None:
        """Collect exit statuses: ours through Popen, adopted orphans directly."""
        for proc in self.procs:
            proc.poll()
        ours = {p.pid for p in self.procs}
        for child in self._descendants():
            if child.pid in ours:
                continue
            try:
                os.waitpid(child.pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def ensure_gone(self, kill_after: float) -> None:
        """Leave nothing behind: TERM what lives, KILL it after ``kill_after``,
        reap everything. Bounded: about ``kill_after`` + 5 s at most."""
        if self.live_descendants():
            self.signal_all(signal.SIGTERM)
            deadline = time.monotonic() + kill_after
            while time.monotonic() < deadline and self.live_descendants():
                self.reap()
                time.sleep(_POLL)
        for _ in range(int(GIVE_UP_AFTER_KILL / _POLL)):
            live = self.live_descendants()
            if not live:
                break
            for child in live:
                try:
                    child.kill()
                except psutil.Error:
                    pass
            self.reap()
            time.sleep(_POLL)
        self.reap()


def _children_of_me() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
