"""The ``wrap_rank`` command: start a worker, prefix its output, report its end.

Start-up time matters (one wrap_rank per worker, on every launch), so this
module imports only small built-in modules; ``json`` is imported lazily, and
only when a status file is wanted. One thread serves both pipes with
``poll``; the child is started with ``posix_spawn``.
"""

from __future__ import annotations

import os
import select
import signal
import sys

from wrap_rank._lines import LINE_CAP, LinePrefixer
from wrap_rank._out import SharedOutput, write_all

#: Environment variable naming the directory for ``rank-<N>.json`` exit
#: records. Same spelling as ``determined_launch.envvars.WRAP_RANK_STATUS_DIR``
#: (wrap_rank must not import determined_launch).
STATUS_DIR_ENV = "WRAP_RANK_STATUS_DIR"

EXIT_USAGE = 2
EXIT_CANNOT_EXECUTE = 126  # shell conventions for a command that cannot run
EXIT_NOT_FOUND = 127

#: Signals passed on to the child. Signals that were ignored when wrap_rank
#: started stay ignored (and are inherited ignored, as under ``nohup``).
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH")

#: After the child exits, read at most this much more per stream: what it
#: wrote before exiting (a pipe holds 64 KiB by default), not the output of a
#: background process that outlives it.
_DRAIN_LIMIT = 1 << 20

USAGE = """\
usage: wrap_rank [--no-redirect-stdio] RANK [--] CMD...

Run CMD and prefix every line of its stdout and stderr with "[rank=N] ",
each on the stream it came from. Exit with CMD's status (128+N if it was
killed by signal N).

RANK  an integer, or a comma-separated list of environment variable names
      tried in order, e.g. RANK,HOROVOD_RANK,OMPI_COMM_WORLD_RANK,PMI_RANK

--no-redirect-stdio  leave CMD's stdout and stderr alone (no prefixes); only
                     forward signals and report the exit status
"""


class UsageError(Exception):
    """Bad command line or rank: one line on stderr, exit status 2."""


class HelpRequested(Exception):
    """``-h``/``--help``: print the usage on stdout and exit 0."""


def parse_args(argv: list[str]) -> tuple[bool, str, list[str]]:
    """Split ``[--no-redirect-stdio] RANK [--] CMD...`` (no argparse: start-up).

    Returns (redirect, rank spec, command); everything after RANK belongs to
    the command, so its own options never need quoting.
    """
    redirect = True
    args = list(argv)
    while args and args[0].startswith("-") and args[0] != "-":
        opt = args.pop(0)
        if opt == "--no-redirect-stdio":
            redirect = False
        elif opt in ("-h", "--help"):
            raise HelpRequested
        else:
            raise UsageError(f"unknown option {opt!r} (see wrap_rank --help)")
    if not args:
        raise UsageError("missing RANK and CMD (see wrap_rank --help)")
    rank_spec = args.pop(0)
    if args and args[0] == "--":
        args.pop(0)
    if not args:
        raise UsageError("missing CMD after RANK (see wrap_rank --help)")
    return redirect, rank_spec, args


def resolve_rank(spec: str, environ: dict[str, str] | None = None) -> int:
    """The rank from an integer or from the first set variable in ``spec``.

    A variable that is set but empty counts as unset; one that is set to
    something other than an integer is an error rather than skipped, since
    it means the launcher and wrap_rank disagree.
    """
    env = os.environ if environ is None else environ
    if spec.isascii() and spec.isdigit():
        return int(spec)
    names = spec.split(",")
    for name in names:
        if not (name.isascii() and name.isidentifier()):
            raise UsageError(
                f"RANK {spec!r} is neither an integer nor a comma-separated list of "
                "environment variable names"
            )
    for name in names:
        value = env.get(name, "").strip()
        if not value:
            continue
        if value.isascii() and value.isdigit():
            return int(value)
        raise UsageError(f"rank variable {name}={value!r} is not a non-negative integer")
    raise UsageError(f"none of the rank variables {spec} is set")


class _Forwarder:
    """Signal handlers that pass signals on to the child.

    Installed before the child starts, so a signal that arrives in between
    is delivered once the child exists instead of killing wrap_rank.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self._pending: list[int] = []
        for name in FORWARDED:
            signum = getattr(signal, name, None)
            if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.pid is None:
            self._pending.append(signum)
            return
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def started(self, pid: int) -> None:
        self.pid = pid
        for signum in self._pending:
            self._handle(signum, None)
        self._pending.clear()

    def reaped(self) -> None:
        # The pid may be reused from now on: never signal it again.
        self.pid = None


def _spawn(cmd: list[str], stdout_fd: int | None, stderr_fd: int | None) -> int:
    actions = []
    if stdout_fd is not None and stderr_fd is not None:
        actions = [
            (os.POSIX_SPAWN_DUP2, stdout_fd, 1),
            (os.POSIX_SPAWN_DUP2, stderr_fd, 2),
        ]
    # Python ignores SIGPIPE and SIGXFSZ for itself; the child gets the
    # defaults back, as subprocess does. Signals with handlers here are reset
    # by exec anyway.
    sigdef = [s for s in (getattr(signal, "SIGPIPE", None), getattr(signal, "SIGXFSZ", None)) if s]
    return os.posix_spawnp(cmd[0], cmd, os.environ, file_actions=actions, setsigdef=sigdef)


class _Stream:
    """One child pipe and where its prefixed lines go."""

    def __init__(self, read_fd: int, out_fd: int, prefix: bytes, duplicate: bytes) -> None:
        self.read_fd = read_fd
        self.out = SharedOutput(out_fd)
        # torch's own "[rankN]:" (its excepthook, TORCH_LOGS) repeats our label
        self.lines = LinePrefixer(prefix, duplicate=duplicate)

    def pump(self) -> bool:
        """Forward what is readable now; False at end of stream."""
        chunk = os.read(self.read_fd, LINE_CAP)
        out = self.lines.feed(chunk) if chunk else self.lines.flush()
        if out:
            try:
                self.out.write(out)
            except OSError:
                # Our reader went away: stop reading, so the child sees a
                # broken pipe just as it would without wrap_rank.
                return False
        return bool(chunk)


def _forward_output(pid: int, streams: list[_Stream], wake_fd: int) -> int | None:
    """Pump both pipes until they close or the child exits.

    Returns the child's wait status if it was reaped here. Once the child
    has exited, whatever it wrote is already in the pipes: that is drained,
    and wrap_rank does not wait for background processes the child left
    holding the pipes (they would otherwise keep it alive forever).
    """
    poller = select.poll()
    by_fd = {s.read_fd: s for s in streams}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    poller.register(wake_fd, select.POLLIN)
    status: int | None = None
    timeout: int | None = None  # block until the child has exited, then drain
    drain_reads = _DRAIN_LIMIT // LINE_CAP
    while by_fd:
        events = poller.poll(timeout)
        if timeout == 0:
            drain_reads -= 1
            if drain_reads < 0 or not any(fd in by_fd for fd, _ in events):
                break
        for fd, _ in events:
            stream = by_fd.get(fd)
            if stream is None:
                _drain(wake_fd)
                if status is None:
                    reaped, status = os.waitpid(pid, os.WNOHANG)
                    if reaped:
                        timeout = 0
                    else:
                        status = None
            elif not stream.pump():
                poller.unregister(fd)
                os.close(fd)
                del by_fd[fd]
    for stream in by_fd.values():
        try:
            stream.out.write(stream.lines.flush())
        except OSError:
            pass
        os.close(stream.read_fd)
    return status


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _wait(pid: int) -> int:
    return os.waitpid(pid, 0)[1]


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def exit_status(wait_status: int) -> tuple[int, int | None]:
    """(exit status, signal number or None), 128+N for death by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    if code < 0:
        return 128 - code, -code
    return code, None


def write_status(
    directory: str, rank: int, status: int, signum: int | None, pid: int | None
) -> None:
    """Atomically write ``<directory>/rank-<rank>.json`` for the supervisor."""
    import json
    import time

    record = {
        "rank": rank,
        "exit_status": status,
        "signal": _signal_name(signum) if signum is not None else None,
        "pid": pid,
        "host": os.uname().nodename,
        "time": time.time(),
    }
    os.makedirs(directory, mode=0o700, exist_ok=True)
    final = os.path.join(directory, f"rank-{rank}.json")
    tmp = os.path.join(directory, f".rank-{rank}.json.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            write_all(fd, json.dumps(record).encode() + b"\n")
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except OSError:
        os.unlink(tmp)  # a full disk, say: leave no half-written file behind
        raise


def _report(rank: int, status: int, signum: int | None, pid: int | None) -> None:
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return
    try:
        write_status(directory, rank, status, signum, pid)
    except OSError as e:
        # The exit status is what matters; the record is a convenience.
        _error(f"cannot write status file in {directory}: {e}")


def _error(message: str) -> None:
    try:
        os.write(2, f"wrap_rank: {message}\n".encode(errors="backslashreplace"))
    except OSError:
        pass


def _determined_workdir() -> None:
    """Inside Determined's Slurm/PBS containers, re-enter the workdir symlink.

    There ``/run/determined/workdir`` links to a per-rank directory, but the
    inherited cwd is its resolved path, which belongs to rank 0; going
    through the link again gives each rank its own directory, as Determined's
    wrap_rank does.
    """
    try:
        if os.getcwd().endswith("/run/determined/workdir"):
            os.chdir("/run/determined/workdir")
    except OSError:
        pass


def run(redirect: bool, rank: int, cmd: list[str]) -> int:
    """Run ``cmd`` as rank ``rank``; return wrap_rank's exit status."""
    _determined_workdir()
    forwarder = _Forwarder()
    streams: list[_Stream] = []
    wake_r = wake_w = -1
    child_fds: list[int] = []
    if redirect:
        prefix = f"[rank={rank}] ".encode()
        for out_fd in (1, 2):
            r, w = os.pipe()
            streams.append(_Stream(r, out_fd, prefix, f"[rank{rank}]:".encode()))
            child_fds.append(w)
        # SIGCHLD wakes the poll loop through this pipe.
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    try:
        pid = _spawn(cmd, *(child_fds or (None, None)))
    except OSError as e:
        status = EXIT_NOT_FOUND if isinstance(e, FileNotFoundError) else EXIT_CANNOT_EXECUTE
        _error(f"cannot run {cmd[0]!r}: {e.strerror}")
        _report(rank, status, None, None)
        return status
    finally:
        for fd in child_fds:
            os.close(fd)
    forwarder.started(pid)
    wait_status = None
    if streams:
        wait_status = _forward_output(pid, streams, wake_r)
    if wait_status is None:
        wait_status = _wait(pid)
    forwarder.reaped()
    status, signum = exit_status(wait_status)
    _report(rank, status, signum, pid)
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m wrap_rank`` and the ``wrap-rank`` script."""
    try:
        redirect, spec, cmd = parse_args(sys.argv[1:] if argv is None else argv)
        rank = resolve_rank(spec)
    except HelpRequested:
        sys.stdout.write(USAGE)
        return 0
    except UsageError as e:
        _error(str(e))
        return EXIT_USAGE
    return run(redirect, rank, cmd)
