"""This rank's progress, for its launcher's hang watchdog and straggler check.

While core.init()'s context is open (under our launchers: ``WRAP_RANK_STATUS_DIR``
is set), every ``should_preempt`` poll, counted quiet poll and report calls
``beat``. A beat costs a clock read and a comparison; at most once a second it
also rewrites one fixed-width line of ``rank-<N>.progress`` in place (one
``pwrite``: pid, steps, busy seconds, wall time), so the launcher sees when
the rank last moved. Beats are made on the calling (training) thread only: a
thread that hangs stops them, whatever else the process does.

``busy`` is the wall time between step beats less the time spent inside the
Core API's own agreements (``waited``), so a rank that only waits for slower
peers there is not itself slow.

The same directory gets ``rank-<N>.stack``: faulthandler dumps every thread's
Python stack into it when the launcher sends ``SIGRTMIN+5``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Mapping
from typing import IO, Optional

from determined_launch import envvars

#: Seconds between two rewrites of the progress line.
PERIOD = envvars.PROGRESS_PERIOD
_WIDTH = 80


def stack_signal() -> int:
    return int(signal.SIGRTMIN) + envvars.PROGRESS_STACK_OFFSET


class Beacon:
    __slots__ = ("_fd", "_stacks", "_next", "_last", "steps", "busy", "_pid", "path")

    def __init__(self, directory: str, rank: int) -> None:
        self.path = os.path.join(directory, envvars.RANK_PROGRESS_FILE.format(rank=rank))
        self._pid = os.getpid()
        self.steps = 0
        self.busy = 0.0
        self._last: Optional[float] = None  # the previous step beat
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        stack_path = os.path.join(directory, envvars.RANK_STACK_FILE.format(rank=rank))
        self._stacks: Optional[IO[str]] = open(stack_path, "w", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(stack_signal(), file=self._stacks, all_threads=True)
        self._next = 0.0

    def beat(self, steps: int = 0) -> None:
        now = time.monotonic()
        if steps:
            if self._last is not None:
                self.busy += now - self._last
                self.steps += steps
            self._last = now
        if now >= self._next:
            self._next = now + PERIOD
            self.write()

    def waited(self, seconds: float) -> None:
        """Time spent waiting for peers inside the Core API: not this rank's step."""
        if self._last is not None:
            self._last += seconds

    def write(self) -> None:
        line = f"{self._pid} {self.steps} {self.busy:.6f} {time.time():.3f}"
        try:
            os.pwrite(self._fd, line.ljust(_WIDTH).encode() + b"\n", 0)
        except OSError:
            pass  # a full disk: the watchdog's problem, never training's

    def close(self) -> None:
        faulthandler.unregister(stack_signal())
        if self._stacks is not None:
            name = self._stacks.name
            self._stacks.close()
            self._stacks = None
            try:
                if os.stat(name).st_size == 0:  # never asked for: leave no file behind
                    os.unlink(name)
            except OSError:
                pass
        os.close(self._fd)
        try:
            os.unlink(self.path)  # no longer judged: core's context is closed
        except OSError:
            pass


_beacon: Optional[Beacon] = None


def start(rank: int, env: Mapping[str, str] = os.environ) -> None:
    """Begin beating under our launchers; outside them (no status directory), nothing."""
    global _beacon
    directory = env.get(envvars.WRAP_RANK_STATUS_DIR)
    if not directory or _beacon is not None:
        return
    try:
        _beacon = Beacon(directory, rank)
    except (OSError, ValueError, RuntimeError):
        _beacon = None  # no watchdog for this rank: never a reason to fail


def stop() -> None:
    global _beacon
    beacon, _beacon = _beacon, None
    if beacon is not None:
        beacon.close()


def beat(steps: int = 0) -> None:
    """Progress: ``steps`` steps completed (0: a report or other sign of life)."""
    beacon = _beacon
    if beacon is not None:
        beacon.beat(steps)


def waited(seconds: float) -> None:
    beacon = _beacon
    if beacon is not None:
        beacon.waited(seconds)
