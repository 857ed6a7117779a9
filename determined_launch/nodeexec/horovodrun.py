"""horovodrun (``horovod.runner.launch``) whose output threads cannot splice lines.

horovodrun forwards each worker's stdout and stderr from a thread per stream
(``safe_shell_exec.prefix_connection``), each calling ``sys.stdout.write``
with one prefixed line. Python's text streams are not thread-safe (the ``io``
docs say so). Unbuffered (``PYTHONUNBUFFERED``, ``-u``), two threads'
``write`` syscalls run at once and a short line lands inside a long one
where the pipe filled up: 4 ranks x 250,000 lines through ``det-launch
horovod`` lost 6,337 lines (issue 24), the cut-off rests going to the tools'
log. Buffered, only the binary buffer's internal lock kept them apart (none
lost in the same run). Here each line is encoded and written whole under one
lock, through ``wrap_rank``'s ``SharedOutput`` (record-locked, as wrap_rank
writes).
"""

from __future__ import annotations

import io
import os
import sys
import threading

from wrap_rank._out import SharedOutput


class LockedLines(io.TextIOBase):
    """A text stream on ``fd`` whose lines reach it whole and alone.

    horovodrun's forwarders write one line per call and then flush; a line
    written in parts (``print`` writes its end separately) is held, per
    thread, until its end or a flush.
    """

    def __init__(self, fd: int, encoding: str = "utf-8") -> None:
        self._out = SharedOutput(fd)
        self._fd = fd
        self._lock = threading.Lock()
        self._held = threading.local()
        self._encoding = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only in io's C base too
        return self._encoding

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        held = getattr(self._held, "text", "") + text
        if held.endswith(("\n", "\r")):
            self._send(held)
        else:
            self._held.text = held
        return len(text)

    def flush(self) -> None:
        self._send(getattr(self._held, "text", ""))

    def _send(self, text: str) -> None:
        self._held.text = ""
        if text:
            data = text.encode(self._encoding, "backslashreplace")
            with self._lock:
                self._out.write(data)


def main() -> None:
    sys.stdout = LockedLines(1)
    sys.stderr = LockedLines(2)
    from horovod.runner.launch import run_commandline

    run_commandline()


if __name__ == "__main__":
    main()
