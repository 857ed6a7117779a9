"""Write prefixed lines to a stream that other ranks write to as well.

Every rank's wrap_rank (and the launcher's relay) usually shares one pipe:
torchrun's stdout, the launcher's, a terminal. A ``write`` to a pipe is
atomic only up to ``PIPE_BUF`` (4096 bytes on Linux); a longer one can be
cut wherever the pipe fills up, and another rank's write lands in the middle
of a line (issue 24: about 1,500 spliced lines in 1,000,000). So:

* Writers of a shared stream take an exclusive POSIX record lock on it
  (``lockf`` on the stream's own inode: the pipe, the terminal, the socket)
  for each batch of lines. Every wrap_rank writing there excludes every other
  one, whatever the stream is and whoever made it: no launcher needs to be
  in between. Record locks belong to a process and an inode, so ranks that
  inherited one shared open file still exclude each other, and the kernel
  drops a lock whose holder dies.
* Under the lock, output to a pipe is cut at line ends into writes of at most
  ``PIPE_BUF`` bytes, each atomic, so a writer that takes no lock (the
  framework launcher printing its own messages) can only come between whole
  lines. A single line longer than that is one write: only such a writer can
  cut it.
* Regular files are not locked (no lock traffic on a network filesystem):
  the kernel serializes each ``write`` to a file, so every write of whole
  lines arrives whole. ``/dev/null`` and other devices are not locked either.

If the lock cannot be taken (``ENOLCK``, a filesystem without locks), the
stream is written without it from then on; lines up to ``PIPE_BUF`` are
still atomic.
"""

from __future__ import annotations

import fcntl
import os
import select
import stat

#: Bytes a pipe writes atomically (POSIX guarantees at least 512).
PIPE_BUF: int = getattr(select, "PIPE_BUF", 4096)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write everything, waiting for room on a non-blocking ``fd``."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            # Our stdout is shared with whoever started us, and some parents
            # make it non-blocking: wait for room instead of losing output.
            select.select([], [fd], [])


class SharedOutput:
    """One output stream written in whole lines, never spliced with another
    writer's (see the module notes)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            mode = 0
        self.batch = stat.S_ISFIFO(mode)
        self.lock = self.batch or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))

    def write(self, data: bytes) -> None:
        """Write ``data``, which is whole lines (each ends with ``\\n``)."""
        if not data:
            return
        locked = self.lock and self._lock()
        try:
            if self.batch and len(data) > PIPE_BUF:
                self._write_batches(data)
            else:
                write_all(self.fd, data)
        finally:
            if locked:
                fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def _lock(self) -> bool:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX)
        except OSError:
            self.lock = False  # no locks here: atomic writes still keep short lines whole
            return False
        return True

    def _write_batches(self, data: bytes) -> None:
        """Whole lines in writes of at most PIPE_BUF bytes (one per line longer)."""
        view = memoryview(data)
        fd, find, rfind = self.fd, data.find, data.rfind
        start, n = 0, len(data)
        while start < n:
            end = rfind(b"\n", start, start + PIPE_BUF) + 1
            if end <= start:  # a line longer than PIPE_BUF: alone, in one write
                end = find(b"\n", start + PIPE_BUF) + 1 or n
            try:
                written = os.write(fd, view[start:end])  # all of it, up to PIPE_BUF
            except BlockingIOError:
                written = 0
            if written < end - start:
                write_all(fd, view[start + written : end])
            start = end
