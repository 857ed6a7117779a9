"""The launcher's own signals during one generation (``node.Supervisor``).

Handlers only queue what arrives; a wake-up pipe (``signal.set_wakeup_fd``)
ends the supervisor's sleep at once, SIGCHLD included, so a worker's exit or
a Ctrl-C is seen without waiting for the next tick. Between generations of a
restarting job, what arrives is kept pending for the next one (``defer``).
"""

from __future__ import annotations

import collections
import os
import select
import signal
from collections.abc import Iterable
from typing import Any

#: Forwarded to every process group without changing the job's state.
FORWARDED_SIGNALS = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2, signal.SIGWINCH)


class SignalInbox:
    """The signals a generation reacts to, queued by its handlers."""

    def __init__(self, deferred: frozenset[int] = frozenset()) -> None:
        #: signals the previous generation blocked for this one; after ``defer``,
        #: those this one blocked for the next
        self.deferred = deferred
        self.queue: collections.deque[int] = collections.deque()
        self._old: dict[int, Any] = {}

    def install(self, preempt_signals: Iterable[int]) -> None:
        wanted = set(preempt_signals) | {signal.SIGINT, signal.SIGTERM} | set(FORWARDED_SIGNALS)
        for sig in wanted:
            self._old[sig] = signal.signal(sig, lambda signum, _frame: self.queue.append(signum))
        self._old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._old_wakeup_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        if self.deferred:
            # What the previous generation deferred is delivered now, to these handlers
            # (before any process starts: children inherit the mask).
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.deferred)
            self.deferred = frozenset()

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, or until a signal arrives."""
        select.select([self._wake_r], [], [], timeout)
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def drain(self) -> Iterable[int]:
        while self.queue:
            yield self.queue.popleft()

    def defer(self) -> None:
        """The job restarts: a signal received while this generation ended, or
        before the next one installs its handlers, is kept pending for it (a
        TERM then preempts or stops the next generation, as it would have
        this one), instead of being lost or killing the launcher between them."""
        wanted = {s for s in self._old if s != signal.SIGCHLD}
        # only those not blocked already (by whoever started us): the next one unblocks them
        self.deferred = frozenset(wanted - signal.pthread_sigmask(signal.SIG_BLOCK, wanted))
        for sig in self.drain():
            os.kill(os.getpid(), sig)  # pending until the next generation unblocks it

    def restore(self) -> None:
        signal.set_wakeup_fd(self._old_wakeup_fd)
        os.close(self._wake_r)
        os.close(self._wake_w)
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}
