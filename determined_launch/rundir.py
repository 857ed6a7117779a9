"""The run directory's one owner: its layout, its identity, and which checkpoint a rerun resumes.

A run directory holds what a master would keep for one run off-cluster::

    <run_dir>/training.jsonl, validation.jsonl, <group>.jsonl, progress.jsonl, searcher.jsonl
    <run_dir>/checkpoints.jsonl       every checkpoint the run committed (and retention's deletes)
    <run_dir>/latest_checkpoint.json  the newest one (``pending`` while a commit is under way)
    <run_dir>/command.json            the command that owns the run (its identity)
    <run_dir>/lease.json              the one live job (its launchers renew it: run_lease.py)
    <run_dir>/exit.json               how the last job ended: its exit status, when (the chief)
    <run_dir>/output.log              what the job printed, run after run (launch/output_record.py)

**Identity.** A run is one (command, trial). The default directory is
``./det_runs/local`` for the local trial (``trial-<id>`` for a scheduler's
trial) when it is free or already this command's; another command gets its
own, ``local-<script>-<8 hex of the command>``, so two scripts run in one
working directory never share metrics or checkpoints. Every checkpoint record
carries the command's key, so even in one explicit ``DET_RUN_DIR`` only the
same command resumes.

**Resume point.** The newest checkpoint of the same identity whose commit
marker exists (``newest_committed``); newer ones without it are named in one
line, never silently skipped. ``det-launch``'s resume line, ``--max-restarts``,
``core``'s ``checkpoint.latest()`` and ``fit(latest_checkpoint="latest")`` all
ask this module.

A leaf (the standard library only), so ``cluster``, ``core``, the launcher and
the readers can all import it; the lease is ``run_lease.py``, beside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

#: Parent of the default run directories, relative to the working directory.
RUNS_ROOT = "det_runs"
LOCAL_RUN_NAME = "local"
#: The checkpoint's commit marker (written last; core/storage/ owns the commit).
METADATA_FILE = "metadata.json"
#: ``RunDir.write_pointer`` name (``latest_checkpoint.json``) and ``append`` stream.
POINTER = "latest_checkpoint"
POINTER_FILE = f"{POINTER}.json"
CHECKPOINT_LOG = "checkpoints"
CHECKPOINT_LOG_FILE = f"{CHECKPOINT_LOG}.jsonl"
COMMAND_FILE = "command.json"
LEASE_FILE = "lease.json"
EXIT_FILE = "exit.json"
OUTPUT_FILE = "output.log"
#: Only so much of the checkpoint log is read (a file from outside), and so
#: many candidates are asked whether they are committed (object storage: a
#: request each).
_LOG_TAIL = 4 << 20
_MAX_CANDIDATES = 64

# --- identity ----------------------------------------------------------------

_INTERPRETER = re.compile(r"^(python(\d+(\.\d+)?)?|bash|sh|env)$")


def command_of(argv: Sequence[str], cwd: Optional[pathlib.Path] = None) -> tuple[str, ...]:
    """The program a command runs, as a run's identity: the script (its real
    path when it is a file here) or ``-m module``; not the interpreter in front
    and its flags, and not the arguments, so that ``python a.py --batches 600``
    continues ``python a.py --batches 300`` (and a bare process's ``sys.argv``,
    ``a.py ...``, is the same command) while ``python b.py`` is another."""
    args = [str(a) for a in argv]
    while args and (_INTERPRETER.match(os.path.basename(args[0])) or args[0] == sys.executable):
        args = args[1:]
        while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
            args = args[1:]
    if not args:
        return ()
    if args[0] in ("-m", "-c"):
        return tuple(args[:2]) if args[0] == "-m" else ("-c",)
    path = pathlib.Path(cwd or pathlib.Path.cwd(), args[0])
    try:
        return (str(path.resolve()),) if path.is_file() else (args[0],)
    except OSError:
        return (args[0],)


def command_key(command: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(command)).encode()).hexdigest()[:16]


def show(command: Sequence[str], limit: int = 160) -> str:
    """The command for one line: relative to here when below, quoted as a
    shell would, control characters escaped."""
    cwd = str(pathlib.Path.cwd())
    shown = [os.path.relpath(a, cwd) if a.startswith(cwd + os.sep) else a for a in command]
    text = shlex.join(shown).encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_command(run_dir: pathlib.Path) -> Optional[tuple[str, ...]]:
    """The command recorded as the run's owner (``None``: none, or unreadable)."""
    data = _read_json(run_dir / COMMAND_FILE, 1 << 16)
    command = data.get("command") if isinstance(data, dict) else None
    if isinstance(command, list) and all(isinstance(a, str) for a in command):
        return tuple(command)
    return None


def record_command(run_dir: pathlib.Path, command: Sequence[str]) -> None:
    """Make ``command`` the run's owner (the chief, before any worker writes)."""
    if read_command(run_dir) == tuple(command):
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / COMMAND_FILE, json.dumps(
        {"command": list(command), "key": command_key(command)}) + "\n")


def record_exit(run_dir: pathlib.Path, status: Optional[int], when: float) -> None:
    """The job's exit status (the chief, as it ends), so a reader (the WebUI)
    tells a crashed run from an idle one; None (a job starts) removes the last one's."""
    path = run_dir / EXIT_FILE
    if status is None:
        path.unlink(missing_ok=True)
        return
    write_atomically(path, json.dumps({"exit_status": status, "time": when}) + "\n")


def base_name(trial_id: Optional[int], local: bool) -> str:
    return LOCAL_RUN_NAME if trial_id is None or local else f"trial-{trial_id}"


def default_run_dir(name: str, command: Sequence[str],
                    cwd: Optional[pathlib.Path] = None) -> pathlib.Path:
    """``./det_runs/<name>`` when it is free or this command's (a directory
    from before commands were recorded counts as free); else this command's
    own ``./det_runs/<name>-<script>-<hash>``."""
    root = (cwd or pathlib.Path.cwd()) / RUNS_ROOT
    shared = (root / name).absolute()
    owner = read_command(shared)
    if owner is None or owner == tuple(command):
        return shared
    script = next((a for a in command if not a.startswith("-")), "run")
    slug = re.sub(r"[^A-Za-z0-9_.]+", "_", pathlib.PurePath(script).stem)[:24] or "run"
    return (root / f"{name}-{slug}-{command_key(command)[:8]}").absolute()


def run_dir_for(name: str, command: Sequence[str], env: Mapping[str, str],
                run_dir_env: str) -> pathlib.Path:
    """``env[run_dir_env]`` (``DET_RUN_DIR``), else the default run directory."""
    if env.get(run_dir_env):
        return pathlib.Path(env[run_dir_env]).expanduser().absolute()
    return default_run_dir(name, command)


@dataclasses.dataclass(frozen=True)
class Identity:
    """Which records are this run's: the same trial id, hyperparameters and
    command (a record without one of them, written before it was recorded,
    matches any)."""

    trial_id: Optional[int] = None
    local: bool = False
    hparams: Optional[Mapping[str, Any]] = None
    command: Optional[str] = None  # command_key

    def fields(self) -> dict[str, Any]:
        """What every checkpoint record of the run carries."""
        return {"trial_id": self.trial_id, "hparams": _plain(self.hparams),
                "command": self.command}

    def matches(self, record: Mapping[str, Any]) -> bool:
        recorded = record.get("trial_id", "absent")
        any_trial = self.trial_id is None and not self.local
        if not any_trial and recorded not in ("absent", self.trial_id) and not (
                recorded is None and (self.local or self.trial_id is None)):
            return False
        hparams = record.get("hparams")
        if hparams is not None and self.hparams is not None and hparams != _plain(self.hparams):
            return False
        command = record.get("command")
        return command is None or self.command is None or command == self.command


def _plain(value: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    return None if value is None else json.loads(json.dumps(dict(value), default=str))


# --- the newest committed checkpoint -------------------------------------------


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where a rerun starts: the newest committed checkpoint of the run (if
    any), its ``steps_completed`` when recorded, and the newer ones skipped
    because their commit marker is missing."""

    storage_id: Optional[str] = None
    steps: Optional[int] = None
    skipped: tuple[str, ...] = ()

    def skipped_line(self) -> str:
        """One line naming what was skipped ('' when nothing was)."""
        if not self.skipped:
            return ""
        names = ", ".join(self.skipped[:3]) + (" ..." if len(self.skipped) > 3 else "")
        to = f"resuming from {self.storage_id}" if self.storage_id else "none older is committed"
        return (f"skipped {len(self.skipped)} newer checkpoint(s) without a commit marker "
                f"({METADATA_FILE}): {names}; {to}")


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 200 and "/" not in value \
        and "\\" not in value and not value.startswith(".") and value.isprintable()


def candidates(pointer: Optional[Mapping[str, Any]], log: Sequence[Mapping[str, Any]],
               identity: Identity) -> list[tuple[str, Optional[int]]]:
    """This run's checkpoints, newest first, as (storage id, steps): the
    pointer's ``pending`` and ``storage_id`` (a save killed after its commit
    but before the log line), then the log backwards; retention's deletes
    left out. Pure."""
    deleted = {r["deleted"] for r in log if isinstance(r.get("deleted"), str)}
    out: list[tuple[str, Optional[int]]] = []
    seen: set[str] = set()

    def add(sid: Any, steps: Any) -> None:
        if _valid_id(sid) and sid not in seen and sid not in deleted:
            seen.add(sid)
            ok = isinstance(steps, int) and not isinstance(steps, bool)
            out.append((sid, steps if ok else None))

    if pointer is not None and identity.matches(pointer):
        meta = pointer.get("metadata")
        add(pointer.get("pending"), None)
        add(pointer.get("storage_id"),
            meta.get("steps_completed") if isinstance(meta, dict) else None)
    for record in reversed(log):
        if "storage_id" in record and identity.matches(record):
            add(record.get("storage_id"), record.get("steps_completed"))
    return out


def newest_of(cands: Sequence[tuple[str, Optional[int]]],
              is_committed: Callable[[str], bool]) -> Resume:
    """THE rule: the first candidate whose commit marker exists; the ones
    before it are skipped (named). Pure but for ``is_committed``."""
    skipped: list[str] = []
    for sid, steps in cands[:_MAX_CANDIDATES]:
        if is_committed(sid):
            return Resume(sid, steps, tuple(skipped))
        skipped.append(sid)
    return Resume(None, None, tuple(skipped))


def newest_committed(run_dir: pathlib.Path, identity: Identity,
                     is_committed: Callable[[str], bool]) -> Resume:
    """The run directory's resume point (see the module doc)."""
    pointer = _read_json(run_dir / POINTER_FILE, 1 << 20)
    return newest_of(candidates(pointer if isinstance(pointer, dict) else None,
                                read_log(run_dir), identity), is_committed)


def directory_committed(storage: pathlib.Path) -> Callable[[str], bool]:
    """The commit check of a checkpoint directory: the marker is a file there."""
    return lambda sid: (storage / sid / METADATA_FILE).is_file()


def trusting(run_dir: pathlib.Path) -> Callable[[str], bool]:
    """The check where none can look into the storage: every recorded
    checkpoint is taken as committed but the one a commit is under way for."""
    pointer = _read_json(run_dir / POINTER_FILE, 1 << 20)
    pending = pointer.get("pending") if isinstance(pointer, dict) else None
    return lambda sid: sid != pending


def read_log(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    """``checkpoints.jsonl``'s records (its last 4 MiB; a torn or bad line is skipped)."""
    try:
        with open(run_dir / CHECKPOINT_LOG_FILE, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _LOG_TAIL))
            data = f.read(_LOG_TAIL)
    except OSError:
        return []
    lines = data.split(b"\n")
    if len(data) == _LOG_TAIL and size > _LOG_TAIL:
        lines = lines[1:]  # the first is a piece of a line
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _read_json(path: pathlib.Path, limit: int) -> Any:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            return json.loads(f.read(limit))
    except (OSError, ValueError, RecursionError):
        return None


def write_atomically(path: pathlib.Path, text: str) -> None:
    """Replace ``path`` so that readers see the old or the new content, never half
    (the run directory's pointers, owner, lease; core's streams' pointers too)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a symlink itself, never what it points to
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
