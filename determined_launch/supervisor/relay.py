"""Split a framework launcher's output: its workers' lines to our streams,
its own lines (torchrun's agent, deepspeed's runner, horovodrun's driver) to
a log file in the job directory.

Why a relay: the workers are the tool's children and inherit its stdout and
stderr, so the two cannot be told apart by file descriptor. They can by
content: wrap_rank labels every worker line ``[rank=N] `` (horovodrun puts
``[N]<stdout>:`` before it, pdsh ``host: ``), and the launcher's and the
gate's own messages start with ``det-launch``. Everything else is the tool
talking: banners, INFO logs, and the ``SignalException`` traceback torchrun
prints whenever a job fails.

Cost: one more pipe hop and a thread per stream, in C for chunks made only of
worker lines (the usual case; see ``LineRouter.feed``). With
``--verbose`` nothing is relayed: the tool writes to our streams directly.

Nothing a worker prints is lost here (issue 24): worker lines leave whole
(a line cut by a read is held until its end, and writes go through
``wrap_rank``'s ``SharedOutput``, as wrap_rank's own do), the relay reads
its pipes to the end before the launcher exits, and a line on the tools'
stdout that is not a tool's own log noise makes the log outlive even a
successful job: it is what a worker printed without a label.
"""

from __future__ import annotations

import os
import re
import select
import sys
import tempfile
import threading
import time
from typing import Optional

from determined_launch.errors import EXIT_OK, EXIT_PREEMPTED
from determined_launch.supervisor.events import Failure
from wrap_rank._out import SharedOutput, write_all

#: A line that passes through: wrap_rank's label (after a tool's own prefix,
#: if any), or a message of ours.
_OURS = re.compile(rb"(?:[^\s\[\]]{1,255}: |\[[\d,]+\]<std(?:out|err)>:)?(?:\[rank=\d|det-launch)")
#: Bytes of a line after which it is routed without waiting for its end.
_DECIDE_AT = 300
#: Seconds an unfinished line head waits for more bytes before it is routed.
_PAUSE = 0.1
_READ = 65536
#: A worker line is held for its end up to this many bytes (wrap_rank's cap
#: plus room for labels), then passed on in pieces.
_HOLD = 2 * _READ
#: A tool's own log lines on stdout, as the tools print them (Python's and
#: DeepSpeed's logging, glog, torchrun's banner, blank lines), after pdsh's
#: ``host: ``. Any other unlabelled stdout line may be a worker's: kept.
_NOISE = re.compile(
    rb"(?:[^\s\[\]]{1,255}: )?\s*(?:$|\*{5,}\s*$"
    rb"|\[\d{4}-\d\d-\d\d[ T][\d:.,]+\]|\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\]"
    rb"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:|[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ )"
)
#: Lines of the log printed when the tool itself is what failed.
TAIL_LINES = 20


def _all_ours(chunk: bytes, start: int, end: int) -> bool:
    """``chunk[start:end]`` is whole lines, each starting ``[rank=``: decided in C."""
    return chunk.startswith(b"[rank=", start) and chunk.count(b"\n", start, end) == (
        chunk.count(b"\n[rank=", start, end) + 1
    )


class LineRouter:
    """Routes one stream's bytes line by line; pure, so it is unit tested.

    ``feed`` returns ``(ours, tool)``: the bytes to pass through and the
    bytes for the log, each in order. A line is routed by its first bytes;
    the rest of a long line follows the same way without being held.
    """

    def __init__(self) -> None:
        self._head = b""  # the undecided start of the current line
        self._ours: Optional[bool] = None  # the current line's route, once decided

    @property
    def holding(self) -> bool:
        return bool(self._head)

    def feed(self, chunk: bytes) -> tuple[bytes, bytes]:
        ours: list[bytes] = []
        tool: list[bytes] = []
        pos, n = 0, len(chunk)
        # Worker lines in bulk, in C: tried once per chunk, where its first
        # whole line starts (after the line a previous chunk left unfinished).
        # Otherwise (a tool's line among them, horovodrun's prefixes) line by
        # line, in Python: rare, and never repeated scans of the chunk.
        bulk = True
        while pos < n:
            if self._ours is None and not self._head and bulk:
                bulk = False
                last = chunk.rfind(b"\n", pos) + 1
                if last > pos and _all_ours(chunk, pos, last):
                    ours.append(chunk[pos:last])
                    pos = last
                    continue
            end = chunk.find(b"\n", pos)
            stop = n if end < 0 else end + 1
            if self._ours is None:
                piece = self._head + chunk[pos:stop]
                ours_now = bool(_OURS.match(piece))
                if end < 0 and len(piece) < _DECIDE_AT and not ours_now:
                    self._head = piece  # too short to tell yet
                    break
                self._head = b""
                self._ours = ours_now
            else:
                piece = chunk[pos:stop]
                bulk = True  # the unfinished line ends here: try the rest in bulk
            (ours if self._ours else tool).append(piece)
            if end >= 0:
                self._ours = None
            pos = stop
        return b"".join(ours), b"".join(tool)

    def flush(self) -> tuple[bytes, bytes]:
        """Route a held line head now (after a pause, or at the end)."""
        head, self._head = self._head, b""
        if not head:
            return b"", b""
        self._ours = bool(_OURS.match(head))
        return (head, b"") if self._ours else (b"", head)


def labels_workers(argv: tuple[str, ...]) -> bool:
    """Whether wrap_rank labels this tool's workers' lines, so the relay can
    tell them from the tool's (our plans always do; a tool whose workers run
    unlabelled is not relayed: everything it writes is shown)."""
    return "wrap_rank" in argv and "--no-redirect-stdio" not in argv


def not_noise(lines: bytes) -> bool:
    """Whether any of these unlabelled stdout lines is not a tool's log noise."""
    return any(not _NOISE.match(line) for line in lines.splitlines())


class ToolOutput:
    """The relays of one node's framework launchers, and their shared log.

    ``pipes()`` gives a tool's stdout and stderr; each read end gets a
    thread that routes its lines (stdout to our stdout, stderr to our
    stderr, the tool's own lines of both to ``log_path``).
    """

    def __init__(self, log_path: str, tool_names: tuple[str, ...] = ()) -> None:
        self.log_path = log_path
        self.tool_names = tool_names
        #: Set once an unlabelled stdout line that is not tool noise reached the log.
        self.stdout_kept = False
        self._log_fd: Optional[int] = None
        self._lock = threading.Lock()
        #: Every relay thread of the process writes our streams under this
        #: lock (``SharedOutput``'s record lock keeps out other processes only).
        self._out_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: The tools' stdout log ended mid-line: its next bytes continue a line
        #: already judged (a long one the router passed on in pieces).
        self._stdout_mid_line = False
        #: thread ident -> when it began waiting for input (None: busy).
        self._waiting: dict[Optional[int], Optional[float]] = {}

    def pipes(self) -> tuple[int, int]:
        """Write ends for a tool's stdout and stderr; the caller closes them
        once the tool has started (the tool holds its own copies)."""
        ends = []
        for out_fd in (1, 2):  # where the tool would have written without us
            read_fd, write_fd = os.pipe()
            thread = threading.Thread(
                target=self.pump, args=(read_fd, out_fd), daemon=True,
                name="det-launch tool relay",
            )
            thread.start()
            self._threads.append(thread)
            ends.append(write_fd)
        return ends[0], ends[1]

    def pump(self, read_fd: int, out_fd: int) -> None:
        """Route one stream until its end (a relay thread's whole life)."""
        router = LineRouter()
        out = SharedOutput(out_fd)
        me = threading.get_ident()
        held = b""  # our lines' unfinished end, written once the line is whole
        try:
            while True:
                self._waiting[me] = time.monotonic()
                if (router.holding or held) and not select.select([read_fd], [], [], _PAUSE)[0]:
                    self._waiting[me] = None
                    ours, tool = router.flush()
                    held = self._pass(out, held + ours, True)
                    self._log(out_fd, tool)
                    continue
                chunk = os.read(read_fd, _READ)
                self._waiting[me] = None
                if not chunk:
                    break
                ours, tool = router.feed(chunk)
                held = self._pass(out, held + ours, False)
                self._log(out_fd, tool)
            ours, tool = router.flush()
            self._pass(out, held + ours, True)
            self._log(out_fd, tool)
        except OSError:
            pass  # our stream went away: the tool sees a broken pipe, as without us
        finally:
            self._waiting[me] = None
            os.close(read_fd)

    def _pass(self, out: SharedOutput, ours: bytes, everything: bool) -> bytes:
        """Write ``ours`` up to its last whole line (all of it if
        ``everything`` or too long to hold); return what is held back."""
        cut = len(ours) if everything else ours.rfind(b"\n") + 1
        if len(ours) - cut > _HOLD:
            cut = len(ours)
        if cut:
            with self._out_lock:
                out.write(ours[:cut])
        return ours[cut:]

    def _log(self, out_fd: int, tool: bytes) -> None:
        if not tool:
            return
        with self._lock:
            if out_fd == 1:
                whole = tool.partition(b"\n")[2] if self._stdout_mid_line else tool
                self._stdout_mid_line = not tool.endswith(b"\n")
                if not self.stdout_kept and not_noise(whole):
                    self.stdout_kept = True
            if self._log_fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                self._log_fd = os.open(self.log_path, flags, 0o600)
            write_all(self._log_fd, tool)

    def close(self, timeout: float = 2.0) -> None:
        """Wait for the relays to reach the end of their pipes (every
        descendant is gone by now, so that is prompt however much is still
        to pass: a relay writing to a slow reader is waited for), then close
        the log. Bounded: a relay that has waited ``timeout`` seconds for
        input from a pipe that an unkillable process still holds is
        abandoned."""
        for thread in self._threads:
            while thread.is_alive():
                thread.join(0.05)
                since = self._waiting.get(thread.ident)
                if since is not None and time.monotonic() - since > timeout:
                    break
        with self._lock:
            if self._log_fd is not None:
                os.close(self._log_fd)
                self._log_fd = None

    def has_log(self) -> bool:
        try:
            return os.path.getsize(self.log_path) > 0
        except OSError:
            return False

    def keep(self, prefix: str) -> Optional[str]:
        """Move the log out of the job directory (which the launcher deletes)
        into a private file beside it; its path, or None if there is none."""
        if not self.has_log():
            return None
        parent = os.path.dirname(os.path.dirname(os.path.abspath(self.log_path)))
        fd, kept = tempfile.mkstemp(prefix=prefix, suffix=".log", dir=parent)  # mode 0600
        os.close(fd)
        try:
            os.replace(self.log_path, kept)
        except OSError:
            os.unlink(kept)
            return None
        return kept


def tail(path: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a file, decoded leniently."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    return b"\n".join(data.rstrip(b"\n").split(b"\n")[-lines:]).decode("utf-8", "replace")


def report_tool_log(output: ToolOutput, status: int, cause: Optional[Failure], node: int) -> str:
    """After the job: what the summary line says about the tools' log.

    A failed job keeps the log (the job directory is deleted) and the
    summary names it; so does a successful one whose tools' stdout carried
    a line that is not their log noise (a worker's, unlabelled: never
    deleted). When the tool itself is what failed first (a bad torchrun
    flag, horovodrun unable to reach a host), no worker line explains why,
    so the log's last lines are printed too.
    """
    output.close()
    if status in (EXIT_OK, EXIT_PREEMPTED) and not output.stdout_kept:
        return ""
    kept = output.keep("det-launch-tools-")
    if kept is None:
        return ""
    if cause is not None and cause.node == node and cause.what in output.tool_names:
        print(f"det-launch: last lines of the launcher tools' log {kept}:\n{tail(kept)}",
              file=sys.stderr, flush=True)
    return f" (launcher tools' log: {kept})"
