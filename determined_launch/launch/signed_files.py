"""``<run_dir>/generations/``: small files signed with the job's key, never followed.

The run directory may be shared (a group's project directory, as
``--min-nodes`` needs every node to see it), so anyone who can write there
may plant a symbolic link where a launcher writes (``alive-0`` ->
``/etc/passwd``: a root-run job would overwrite it) or a file a launcher
reads (``join-7``, a ``1.json`` naming other members). Hence:

* a run directory writable by others than its owner and the job's own group
  is refused (``refusal``, one line, exit status 2);
* the run directory is opened once and everything below is reached from
  that descriptor (``openat``), ``generations`` with ``O_NOFOLLOW``: a
  parent swapped for a link later leads nowhere else;
* a file is written whole under a fresh name (``O_CREAT | O_EXCL |
  O_NOFOLLOW``) and renamed or linked into place: a rename replaces a link
  itself, never its target; reads open with ``O_NOFOLLOW | O_NONBLOCK``,
  take regular files only and at most ``MAX_BYTES``;
* each file is ``<hex HMAC-SHA256> <text>``, the HMAC over its name and text
  under a key derived from the job secret, checked before the text is
  parsed; one that fails is ignored and named once (``det-launch: ignoring
  ...``). Who can write the directory can still delete files (deny), never
  forge or alter one.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import pathlib
import secrets
import stat
import sys
import weakref
from typing import Any, Callable, Optional, Protocol

#: under the run directory
CLAIMS_DIR = "generations"
#: a signed file is small; more is not ours
MAX_BYTES = 64 * 1024
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def claims_key(secret: str) -> bytes:
    """The files' key: the job secret's, apart from the control channel's."""
    return hashlib.sha256(b"determined_launch claims\0" + secret.encode()).digest()


def sign(key: bytes, name: str, text: str) -> bytes:
    mac = hmac.new(key, f"{name}\0{text}".encode(), hashlib.sha256).hexdigest()
    return f"{mac} {text}".encode()


def verify(key: bytes, name: str, raw: bytes) -> Optional[str]:
    """The text of a signed file's bytes; ``None`` unless signed by ``key`` for ``name``."""
    try:
        mac, text = raw.decode("utf-8").split(" ", 1)
    except (UnicodeDecodeError, ValueError):
        return None
    good = hmac.new(key, f"{name}\0{text}".encode(), hashlib.sha256).hexdigest()
    return text if hmac.compare_digest(mac, good) else None


def refusal(path: pathlib.Path, st: os.stat_result, groups: set[int]) -> Optional[str]:
    """Why a run directory is too open for ``--min-nodes`` (pure): writable by
    everyone, or by a group that is not the job's (``groups``). ``None``: fine."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH:
        who = "everyone"
    elif mode & stat.S_IWGRP and st.st_gid not in groups:
        who = f"group {st.st_gid}, which this job's user is not in"
    else:
        return None
    return (f"run directory {path} is writable by {who} (mode {mode:04o}): --min-nodes keeps "
            f"its nodes' claims there; share it with the job's own group at most (chmod o-w,g-w "
            f"or chgrp) or set DET_RUN_DIR elsewhere")


def printable(name: str) -> str:
    """A name from the directory, safe to print (no terminal escapes)."""
    return name if name.isprintable() and name.isascii() else ascii(name)


def say(line: str) -> None:
    print(f"det-launch: {line}", file=sys.stderr, flush=True)


class Stat(Protocol):
    """What the claims read of a file's status (``os.stat_result``, or a bucket's ``Stamp``)."""

    @property
    def st_ino(self) -> int: ...
    @property
    def st_mtime(self) -> float: ...
    @property
    def st_mtime_ns(self) -> int: ...


class ClaimFiles(Protocol):
    """Where a job's signed claims and presence files live: ``SignedDir`` (the
    run directory) or ``bucket_claims.SignedBucket`` (S3). ``write(exclusive=
    True)`` is create-if-absent: the one operation the rules depend on."""

    path: Any
    say: Callable[[str], None]

    def refusal(self) -> Optional[str]: ...
    def unwritable(self) -> Optional[str]: ...
    def reset(self) -> None: ...
    def names(self) -> list[str]: ...
    def write(self, name: str, text: str, exclusive: bool = False) -> bool: ...
    def read(self, name: str) -> Optional[str]: ...
    def stat(self, name: str) -> Optional[Stat]: ...
    def unlink(self, name: str) -> None: ...
    def tell(self, name: str, why: str) -> None: ...


class SignedDir:
    """``<run_dir>/generations`` reached from a descriptor of ``run_dir``."""

    def __init__(self, run_dir: pathlib.Path, secret: str,
                 say: Callable[[str], None] = say) -> None:
        self.path = run_dir / CLAIMS_DIR
        self.key = claims_key(secret)
        self.say = say
        self._told: set[str] = set()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        weakref.finalize(self, os.close, self.run_fd)

    def refusal(self) -> Optional[str]:
        """``refusal`` of the run directory (as opened) and of ``generations``."""
        groups = {os.getegid(), *os.getgroups()}
        why = refusal(self.path.parent, os.fstat(self.run_fd), groups)
        if why is None:
            try:
                st = os.stat(CLAIMS_DIR, dir_fd=self.run_fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            why = refusal(self.path, st, groups) if stat.S_ISDIR(st.st_mode) else None
        return why

    def unwritable(self) -> Optional[str]:
        """Why files cannot be made in ``generations`` (one line; ``None``: they
        can): a launcher finds out at its start, not at its first claim."""
        try:
            os.mkdir(CLAIMS_DIR, 0o775, dir_fd=self.run_fd)
        except FileExistsError:
            pass
        except OSError as e:
            return f"cannot create {self.path}: {e.strerror}"
        fd = self._dir()
        if fd is None:
            return f"{self.path} is not a directory"
        probe = f".probe.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(probe, _NEW, 0o600, dir_fd=fd))
            os.unlink(probe, dir_fd=fd)
        except OSError as e:
            return f"cannot write in {self.path}: {e.strerror}"
        finally:
            os.close(fd)
        return None

    # ------------------------------------------------------------------ the directory
    def _dir(self, create: bool = False) -> Optional[int]:
        """A descriptor of ``generations`` (the caller closes it); ``None``: none there."""
        try:
            return os.open(CLAIMS_DIR, _DIR, dir_fd=self.run_fd)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as e:  # ELOOP/ENOTDIR: a link or a file where the directory belongs
            self.tell(CLAIMS_DIR, f"not a directory ({e.strerror})")
            return None
        try:  # never writable by others, whatever the umask (the next start would refuse it)
            os.mkdir(CLAIMS_DIR, 0o775, dir_fd=self.run_fd)
        except FileExistsError:
            pass
        try:
            return os.open(CLAIMS_DIR, _DIR, dir_fd=self.run_fd)
        except OSError:
            return None

    def reset(self) -> None:
        """Remove ``generations`` (a link in its place goes, not its target) and make it anew."""
        try:
            st = os.stat(CLAIMS_DIR, dir_fd=self.run_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            os.unlink(CLAIMS_DIR, dir_fd=self.run_fd)
        elif st is not None:
            fd = self._dir()
            if fd is not None:
                try:
                    for name in os.listdir(fd):
                        _remove(name, fd)
                finally:
                    os.close(fd)
            try:
                os.rmdir(CLAIMS_DIR, dir_fd=self.run_fd)
            except OSError:
                pass  # what could not go is ignored or refused when read
        fd = self._dir(create=True)
        if fd is not None:
            os.close(fd)

    def names(self) -> list[str]:
        fd = self._dir()
        if fd is None:
            return []
        try:
            return os.listdir(fd)
        except OSError:
            return []
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ files
    def write(self, name: str, text: str, exclusive: bool = False) -> bool:
        """``name`` holds ``text``, signed, whole. ``exclusive``: only if no
        ``name`` exists yet (False if one does)."""
        fd = self._dir(create=True)
        if fd is None:
            return False
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            out = os.open(tmp, _NEW, 0o644, dir_fd=fd)
            try:
                os.write(out, sign(self.key, name, text))
                if exclusive:
                    os.fsync(out)
            finally:
                os.close(out)
            if not exclusive:
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                return True
            try:
                os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                return True
            except FileExistsError:
                return False
        except OSError:
            return False
        finally:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            os.close(fd)

    def read(self, name: str) -> Optional[str]:
        """The text of ``name`` if this job signed it; ``None`` if absent or not (told once)."""
        fd = self._dir()
        if fd is None:
            return None
        try:
            f = os.open(name, _READ, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.tell(name, "a symbolic link" if e.errno == errno.ELOOP else str(e.strerror))
            return None
        finally:
            os.close(fd)
        try:
            if not stat.S_ISREG(os.fstat(f).st_mode):
                self.tell(name, "not a regular file")
                return None
            raw = os.read(f, MAX_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(f)
        text = None if len(raw) > MAX_BYTES else verify(self.key, name, raw)
        if text is None:
            self.tell(name, f"over {MAX_BYTES // 1024} KiB" if len(raw) > MAX_BYTES else
                      "not signed with this job's key (another job's, or not a launcher's)")
        return text

    def stat(self, name: str) -> Optional[os.stat_result]:
        """``name``'s own status (a link's, not its target's); ``None``: absent."""
        fd = self._dir()
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def unlink(self, name: str) -> None:
        fd = self._dir()
        if fd is not None:
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def tell(self, name: str, why: str) -> None:
        """Name a file that is ignored, once per name."""
        if name not in self._told:
            self._told.add(name)
            where = self.path.parent if name == CLAIMS_DIR else self.path
            self.say(f"ignoring {where}/{printable(name)}: {why}")


def _remove(name: str, dir_fd: int) -> None:
    """Remove an entry (a directory in ``generations`` is not ours: its tree goes
    through descriptors too), never following a link."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return
    except IsADirectoryError:
        pass
    except OSError as e:
        if e.errno not in (errno.EISDIR, errno.EPERM):
            return
    try:
        sub = os.open(name, _DIR, dir_fd=dir_fd)
    except OSError:
        return
    try:
        for inner in os.listdir(sub):
            _remove(inner, sub)
    finally:
        os.close(sub)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        pass
