"""The run's own output, kept in ``<run_dir>/output.log`` by the chief's launcher.

Why: a run that crashed must show, in ``det-launch ui`` and to whoever looks
at its run directory later, *why*: its exception is on its stderr, which
went to a terminal or a scheduler's log file that the run directory does not
know. So the chief's launcher puts itself between its own stdout/stderr and
everything it starts: its descendants inherit the write ends of two channels,
and one thread copies what comes out to the launcher's original streams and
appends it to ``output.log``. The launcher's own lines (``det-launch: job
failed ...``) go the same way, so the log reads like the terminal did.

What the programs see does not change:

* launcher streams that are not terminals (a file, a pipe: batch jobs,
  ``nohup``, CI) become pipes, which programs treat like files (block
  buffering, no colours);
* terminals become pseudo-terminals of the terminal's size, so colours,
  progress bars and ``breakpoint()`` still work (stdin is never touched).

Lines reach the original streams whole (``wrap_rank``'s ``SharedOutput``), a
line without its end is passed on after ``_PAUSE`` (a progress bar's ``\\r``).
Not recorded: a launcher whose stdout already *is* that file (the experiment
driver sends each trial's output there itself), other nodes' output (their
own run directories may not be shared; the chief's ranks are labelled), and
output after the launcher returns. Appended, run after run: a resumed run's
log is its whole history, as Determined's trial logs were.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import select
import struct
import sys
import termios
import threading
from pathlib import Path
from typing import Optional

from determined_launch import rundir
from wrap_rank._out import SharedOutput, write_all

_READ = 65536
#: Seconds a line without its end waits for more before it is passed on.
_PAUSE = 0.1
#: A line longer than this is passed on in pieces rather than held.
_HOLD = 2 * _READ
#: Seconds ``stop`` waits for a descendant that outlived the job to let go.
_DRAIN = 5.0


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _channel(original: int) -> tuple[int, int]:
    """(read end, write end) standing in for ``original``: a pty of the same
    size for a terminal, else a pipe."""
    if not os.isatty(original):
        return os.pipe()
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR  # keep "\n" (the real terminal adds its own "\r")
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    try:
        size = fcntl.ioctl(original, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    except OSError:
        pass
    return master, slave


class OutputRecord:
    """Copies this process's fds 1 and 2 (and all its descendants') to a log
    file as well; ``stop`` puts the original streams back."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        sys.stdout.flush()
        sys.stderr.flush()
        self._log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._originals = (os.dup(1), os.dup(2))
        self._outs: dict[int, SharedOutput] = {}
        for target, original in zip((1, 2), self._originals):
            read_end, write_end = _channel(original)
            os.dup2(write_end, target)
            os.close(write_end)
            self._outs[read_end] = SharedOutput(original)
        self._thread = threading.Thread(target=self._pump, daemon=True,
                                        name="det-launch output record")
        self._thread.start()

    @classmethod
    def start(cls, run_dir: Path) -> Optional[OutputRecord]:
        """Record into ``run_dir``'s output log, unless stdout is that file already
        or the log cannot be opened (then the run goes on unrecorded)."""
        path = run_dir / rundir.OUTPUT_FILE
        if _same_file(1, path) or _same_file(2, path):
            return None
        try:
            return cls(path)
        except OSError as e:
            print(f"det-launch: not keeping the run's output in {path}: {e}",
                  file=sys.stderr, flush=True)
            return None

    def _pump(self) -> None:
        held = dict.fromkeys(self._outs, b"")
        while held:
            waiting = any(held.values())
            ready = select.select(list(held), [], [], _PAUSE if waiting else None)[0]
            if not ready:  # a line without its end, and nothing more for a while
                for fd in held:
                    self._emit(fd, held[fd])
                    held[fd] = b""
                continue
            for fd in ready:
                try:
                    chunk = os.read(fd, _READ)
                except OSError as e:  # a pty whose last writer closed says EIO
                    if e.errno != errno.EIO:
                        raise
                    chunk = b""
                if not chunk:
                    self._emit(fd, held.pop(fd))
                    os.close(fd)
                    continue
                data = held[fd] + chunk
                cut = data.rfind(b"\n") + 1
                if len(data) - cut > _HOLD:
                    cut = len(data)
                self._emit(fd, data[:cut])
                held[fd] = data[cut:]

    def _emit(self, fd: int, data: bytes) -> None:
        if not data:
            return
        try:
            self._outs[fd].write(data)
        except OSError:
            pass  # the reader of our stdout went away: the log still gets it
        try:
            write_all(self._log, data)
        except OSError:
            pass  # a full disk must not stop the job's output

    def stop(self) -> None:
        """Put the original streams back and wait for what is still in flight."""
        sys.stdout.flush()
        sys.stderr.flush()
        for target, original in zip((1, 2), self._originals):
            os.dup2(original, target)  # closes our write ends: the pump sees their end
        self._thread.join(_DRAIN)
        if self._thread.is_alive():
            return  # a descendant that escaped still holds a write end: leave the pump its fds
        for fd in (*self._originals, self._log):
            os.close(fd)
