"""One live job per run directory: ``<run_dir>/lease.json``, held and renewed
by the job's launchers (issue 35 §0.1).

A second job on the same run directory gets one line and exit status 2. The
lease belongs to the *job*, not to a process: every node of one job (and a
relaunched launcher of it: ``--max-restarts``, ``--min-nodes`` rejoins) knows
the same key and shares it. A lease nobody renews frees itself: at once (4 s
after the last renewal) when its holder was on this host and is gone, after
15 s otherwise; staleness is measured by the file system's clock.

A leaf beside ``rundir.py`` (standard library only).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pathlib
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from determined_launch import rundir

_LEASE_LOCK = ".lease.lock"

#: a holder renews its lease this often; missing renewals for MISSED seconds,
#: a holder whose launcher is known dead is stale; any after STALE seconds
RENEW_EVERY = 1.0
MISSED = 4.0
STALE = 15.0
HELD, MINE, FREE, WAIT = "held", "mine", "free", "wait"


class LeaseHeld(Exception):
    """Another job holds the run directory (the launcher exits 2)."""


def job_key(secret: Optional[str], env: Mapping[str, str], shape: Sequence[Any] = (),
            lone: bool = True) -> str:
    """Who a job is, for its lease: every node of one job (and its relaunched
    launchers) knows the same secret, or the same scheduler job and node
    list (as ``runtime.job_secret`` derives a key); a lone launcher without
    either is a job of its own."""
    if secret:
        basis = "secret:" + secret
    elif env.get("SLURM_JOB_ID") or not lone:
        basis = json.dumps(["shape", env.get("SLURM_JOB_ID"), [list(x) for x in shape]])
    else:
        basis = "lone:" + secrets.token_hex(16)
    return hashlib.sha256(basis.encode()).hexdigest()[:32]


def lease_verdict(record: Any, age: float, host: str, job: str,
                  pid_alive: Callable[[int], bool],
                  inside: Callable[[int], bool] = lambda pid: False) -> str:
    """Pure: what a job ``job`` on ``host`` may do with the lease ``record``,
    last renewed ``age`` seconds ago. ``MINE``: the same job's, or a job this
    launcher runs inside (``inside(pid)``: the holder is one of our ancestors,
    as for the Core API tutorial's ``launch_per_slot`` run as a trial's
    entrypoint: the outer launcher's job owns the directory and keeps the
    lease); ``FREE``: none or stale; ``WAIT``: its holder looks dead, stale
    soon; ``HELD``: live."""
    if not isinstance(record, dict) or age > STALE:
        return FREE
    if record.get("job") == job:
        return MINE
    pid = record.get("pid")
    here = record.get("host") == host and isinstance(pid, int) and pid > 0
    if here and isinstance(pid, int) and inside(pid):
        return MINE
    if here and isinstance(pid, int) and not pid_alive(pid):
        return FREE if age > MISSED else WAIT
    if not here and age > MISSED:
        return WAIT
    return HELD


def _is_ancestor(pid: int) -> bool:
    """Whether ``pid`` is this process's parent, grandparent, ... (Linux /proc;
    elsewhere: never)."""
    current = os.getppid()
    for _ in range(64):
        if current == pid:
            return True
        if current <= 1:
            return False
        try:
            stat = pathlib.Path(f"/proc/{current}/stat").read_text()
            current = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
        except (OSError, ValueError, IndexError):
            return False
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True


class Lease:
    """``<run_dir>/lease.json``: held by one job's launchers while it runs."""

    def __init__(self, run_dir: pathlib.Path, job: str, what: str = "") -> None:
        self.run_dir, self.job, self.what = run_dir, job, what
        self.path = run_dir / rundir.LEASE_FILE
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _locked(self) -> Any:
        import fcntl  # POSIX; the launcher runs nowhere else

        fd = os.open(self.run_dir / _LEASE_LOCK,
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _age(self, lock_fd: int) -> float:
        """Seconds since the last renewal, by the file system's clock (the lock
        file is touched now), so hosts with skewed clocks agree."""
        try:
            os.utime(lock_fd)
            now = os.fstat(lock_fd).st_mtime
            return max(0.0, now - os.stat(self.path, follow_symlinks=False).st_mtime)
        except OSError:
            return STALE + 1

    def acquire(self, wait: float = STALE + 1) -> None:
        """Hold the lease, or raise ``LeaseHeld``."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LeaseHeld(f"run directory {self.run_dir}: cannot create it: "
                            f"{e.strerror or e}") from None
        deadline = time.monotonic() + wait
        while True:
            verdict, record, age = self._try()
            if verdict in (MINE, FREE):
                break
            if verdict == HELD or time.monotonic() > deadline:
                raise LeaseHeld(self._held_line(record, age))
            time.sleep(0.5)
        self._thread = threading.Thread(target=self._renew, daemon=True,
                                        name="det-launch-lease")
        self._thread.start()

    def _try(self) -> tuple[str, Any, float]:
        try:
            fd = self._locked()
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
                return FREE, None, 0.0  # no locks here: the lease cannot be kept; go on
            raise LeaseHeld(f"run directory {self.run_dir}: cannot lock it: "
                            f"{e.strerror or e}") from None
        try:
            record = rundir._read_json(self.path, 1 << 16)
            age = self._age(fd)
            verdict = lease_verdict(record, age, socket.gethostname(), self.job, _pid_alive,
                                    _is_ancestor)
            if verdict == FREE:
                rundir.write_atomically(self.path, json.dumps(
                    {"job": self.job, "host": socket.gethostname(), "pid": os.getpid(),
                     "what": self.what, "since": time.time()}) + "\n")
            elif verdict == MINE:
                os.utime(self.path, follow_symlinks=False)
            return verdict, record, age
        finally:
            os.close(fd)

    def _held_line(self, record: Any, age: float) -> str:
        rec = record if isinstance(record, dict) else {}
        host = str(rec.get("host", "?")).encode("unicode_escape").decode("ascii")[:80]
        what = str(rec.get("what", "")).encode("unicode_escape").decode("ascii")[:120]
        return (f"run directory {self.run_dir} is in use by another job "
                f"({what + ', ' if what else ''}launcher pid {rec.get('pid', '?')} on {host}, "
                f"lease renewed {age:.0f} s ago): one job at a time per run directory; wait "
                f"for it to end or use another DET_RUN_DIR")

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_EVERY):
            try:
                record = rundir._read_json(self.path, 1 << 16)
                if isinstance(record, dict) and record.get("job") == self.job:
                    os.utime(self.path, follow_symlinks=False)
            except OSError:
                pass

    def release(self, remove: bool = True) -> None:
        """Stop renewing; ``remove``: give the run directory back now (the
        job's chief; other nodes let it go stale)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not remove:
            return
        try:
            fd = self._locked()
        except OSError:
            return
        try:
            record = rundir._read_json(self.path, 1 << 16)
            if isinstance(record, dict) and record.get("job") == self.job:
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.release()

