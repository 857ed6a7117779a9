"""Object-storage PATHs (``s3://bucket/prefix``): what runs and experiments
synced there, mirrored into a private local directory which is then served
like any other.

A storage root is mirrored as ``runs/<run>/`` (each run's records and output,
core/_record_sync.py) and ``experiments/<dir>/`` (an experiment's record and
journal study, experiment/sync.py), with the runs of an experiment's trials
(``runs/<dir>.trial-<id>/``) placed in ``experiments/<dir>/trials/<id>/``, as
``det-launch experiment`` lays them out locally; a PATH may also be ``runs/``,
one run's prefix or one experiment's (``experiments/<dir>``). An experiment
appears once its ``experiment.json`` (uploaded after its study) is there.

Every ``PERIOD`` seconds one listing of ``runs/`` and one of ``experiments/``
(a paginated request per 1,000 objects; the checkpoints are never listed)
find what changed; a grown stream (``*.jsonl``, ``output.log``, the journal)
is fetched from where the mirror's copy ends (one ranged GET, checked against
the copy's last bytes, so its rows are parsed once, as for a local file);
anything else is fetched whole and replaced atomically. A checkpoint's size
and metadata are read from the storage when a page asks (two requests, once
for a committed one). Credentials come from the storage library's usual
places (environment, config files, instance roles) and are never printed:
errors are one line naming the PATH's printable URL.

Keys are another's names: a name too long for a local file name (a
300-character run) is mirrored under a shortened name with a hash of the
whole (``_local_name``), and a key that still cannot be written costs that
key only (one line; the runs after it go on updating).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Optional

from determined_launch.common.redact import printable
from determined_launch.core._record_sync import STORAGE_DIR, is_record
from determined_launch.errors import LaunchError
from determined_launch.experiment.sync import JOURNAL, LOG, RECORD
from determined_launch.experiment.sync import STORAGE_DIR as EXPERIMENTS_DIR

#: seconds between listings: each costs requests (and money) on a cloud store
PERIOD = 5.0
#: bytes of the mirror's copy compared with the object before appending to it
OVERLAP = 1024
#: a trial's run in storage (core/_record_sync.storage_run_name)
TRIAL_RUN = re.compile(r"^(.+)\.trial-(\d+)$")
METADATA = "metadata.json"
#: seconds a committed checkpoint's size and metadata are reused
CHECKPOINT_TTL = 60.0
#: bytes of a mirrored name kept as it is (file systems allow 255)
NAME_BYTES = 100


def _local_name(name: str) -> str:
    """A key's part as a local file name: itself if short, else its start and a
    hash of the whole (two long names never share a directory)."""
    raw = name.encode("utf-8", errors="surrogateescape")
    if len(raw) <= NAME_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return f"{raw[:NAME_BYTES // 2].decode('utf-8', errors='ignore')}-{digest}"


def _local(rel: str) -> str:
    return "/".join(_local_name(part) for part in rel.split("/"))


def _is_stream(name: str) -> bool:
    """Files that only grow: fetched from where the copy ends."""
    return name.endswith(".jsonl") or name in (LOG, JOURNAL)


def _is_run_file(name: str) -> bool:
    return is_record(name) or name == LOG


class Mirror:
    """One object-storage PATH, mirrored into ``self.local``."""

    def __init__(self, url: str) -> None:
        from determined_launch.core.storage import parse_storage
        from determined_launch.core.storage.objectstore import ObjectStorage

        spec = parse_storage(url, where=f"PATH {url}")  # a missing extra: one line naming it
        if spec.is_directory:
            raise LaunchError(f"PATH {url}: not an object-storage URL")
        # The checkpoint storage's own client and check: a wrong bucket or refused
        # credentials is one line now.
        storage = ObjectStorage(spec)
        storage.probe()
        self.url, self.fs, self.base = spec.url, storage.fs, storage.base
        self._protocol = spec.protocol
        self._tmp = tempfile.mkdtemp(prefix="det-ui-")  # 0700: nobody else reads the copy
        self.local = pathlib.Path(self._tmp) / (self.base.rsplit("/", 1)[-1] or "storage")
        self.local.mkdir()
        #: "root", "runs" (PATH is runs/), "run" (one run's prefix) or "experiment"
        self.mode = "root"
        self._experiment = ""
        self.root = self.base  # the storage root: where the checkpoints are
        self._seen: dict[str, Any] = {}
        self._sizes: dict[str, int] = {}
        self._placed: dict[str, str] = {}  # a run in storage -> its local directory
        self._checkpoints: dict[str, tuple[float, dict[str, Any]]] = {}
        self._error = ""
        self._failed: dict[str, str] = {}  # object -> the error of its last fetch
        self._stop = threading.Event()

    def first_sync(self) -> None:
        """The storage root (its ``runs/`` and ``experiments/``, which may
        appear later: the checkpoints are never listed), ``runs/`` itself, one
        run's prefix or one experiment's (``experiments/<dir>``, with its trials)."""
        try:
            self.fs.invalidate_cache()
            parent, _, last = self.base.rpartition("/")
            if last == STORAGE_DIR:
                self.mode, self.root = "runs", parent
            elif parent.endswith(f"/{EXPERIMENTS_DIR}"):
                self.mode, self.root = "experiment", parent.rsplit("/", 1)[0]
                self._experiment = last
            elif any(_is_run_file(p.rstrip("/").rsplit("/", 1)[-1]) for p in self._children()):
                self.mode, parent = "run", self.base.rsplit("/", 1)[0]
                self.root = parent.rsplit("/", 1)[0] if parent.endswith(
                    f"/{STORAGE_DIR}") else parent
            self.sync()
        except Exception as e:  # noqa: BLE001 (the library's errors, whatever their class)
            self.close()
            raise LaunchError(f"PATH {self.url}: cannot read it: {type(e).__name__}: "
                              f"{_line(e)}") from None

    def _children(self) -> list[str]:
        try:
            return list(self.fs.ls(self.base, detail=False))
        except FileNotFoundError:
            return []

    def _find(self, prefix: str, depth: Optional[int]
              ) -> list[tuple[str, list[str], dict[str, Any]]]:
        """``(path, parts under prefix, info)`` of the files ``depth`` deep (any: None)."""
        try:
            found = self.fs.find(prefix, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for path, info in found.items():
            if info.get("type") == "directory" or not path.startswith(prefix + "/"):
                continue
            parts = path[len(prefix) + 1:].split("/")
            if depth in (None, len(parts)) and not any(not p or p.startswith(".") for p in parts):
                out.append((path, parts, info))
        return out

    def _targets(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(object path, local path under self.local, info)`` of what is mirrored."""
        if self.mode == "run":
            return [(p, parts[0], i) for p, parts, i in self._find(self.base, 1)
                    if _is_run_file(parts[0])]
        if self.mode == "runs":
            return [(p, _local("/".join(parts)), i) for p, parts, i in self._find(self.base, 2)
                    if _is_run_file(parts[1])]
        if self.mode == "experiment":  # self.local is the experiment's directory
            exp_files = [(p, (self._experiment, parts[0]), i)
                         for p, parts, i in self._find(self.base, 1)]
        else:
            exp_files = [(p, (parts[0], parts[1]), i)
                         for p, parts, i in self._find(f"{self.base}/{EXPERIMENTS_DIR}", 2)]
        out = []
        experiments = set()
        # Journal first, record last: an experiment appears with its study.
        for path, (exp, name), info in sorted(exp_files,
                                              key=lambda t: (t[1][1] == RECORD, t[0])):
            if name in (RECORD, JOURNAL):
                out.append((path, f"{self._home(exp)}{name}", info))
            if name == RECORD:
                experiments.add(exp)
        for path, (run, name), info in self._find(f"{self.root}/{STORAGE_DIR}", 2):
            m = TRIAL_RUN.match(run)
            if m and m.group(1) in experiments:
                place = f"{self._home(m.group(1))}trials/{int(m.group(2))}"
            elif self.mode == "experiment":
                continue  # another experiment's, or a plain run
            else:
                place = f"{STORAGE_DIR}/{run}"
            if not _is_run_file(name):
                continue
            if self._placed.setdefault(run, place) != place:  # its experiment appeared
                self._forget(_local(self._placed[run]))
                self._placed[run] = place
            out.append((path, f"{place}/{name}", info))
        return [(path, _local(rel), info) for path, rel, info in out]

    def _home(self, experiment: str) -> str:
        """An experiment's local directory, as a prefix ('' in experiment mode)."""
        return "" if self.mode == "experiment" else f"{EXPERIMENTS_DIR}/{experiment}/"

    def _forget(self, rel: str) -> None:
        shutil.rmtree(self.local / rel, ignore_errors=True)
        for table in (self._seen, self._sizes):
            for key in [k for k in table if k.startswith(rel + "/")]:
                del table[key]

    def sync(self) -> None:
        """Fetch what changed since the last sync (size, ETag, time: an object
        whose stamp is the same is never read again)."""
        self.fs.invalidate_cache()  # the writers write: never answer from a listing cache
        failed: dict[str, str] = {}
        for path, rel, info in self._targets():
            stamp = tuple(info.get(k) for k in ("size", "ETag", "LastModified", "mtime",
                                                 "created"))
            if self._seen.get(rel) != stamp:
                try:
                    self._fetch(path, rel, int(info.get("size") or 0))
                except FileNotFoundError:
                    continue  # deleted since the listing
                except OSError as e:  # this key's fault (a name, a full disk): the rest go on
                    failed[path] = f"{type(e).__name__}: {e.strerror or e}"
                    continue
                self._seen[rel] = stamp
        for path, error in failed.items():
            if self._failed.get(path) != error:  # one line per key and error, not per sync
                print(f"det-launch ui: PATH {self.url}: {printable(path)}: {printable(error)}",
                      file=sys.stderr, flush=True)
        self._failed = failed

    def _fetch(self, path: str, rel: str, size: int) -> None:
        local = self.local / rel
        local.parent.mkdir(parents=True, exist_ok=True)
        have = self._sizes.get(rel, 0)
        if _is_stream(local.name) and 0 < have <= size and local.exists():
            # Streams only grow: fetch the new bytes if the object still starts as the copy.
            overlap = min(have, OVERLAP)
            data = self.fs.cat_file(path, start=have - overlap, end=size)
            with open(local, "rb+") as f:
                f.seek(have - overlap)
                if f.read(overlap) == data[:overlap]:
                    f.seek(have)
                    f.write(data[overlap:])
                    self._sizes[rel] = have + len(data) - overlap
                    return
        # New, replaced or shrunk: fetched whole, then renamed (readers see old or new).
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=".fetch-")
        os.close(fd)
        try:
            self.fs.get_file(path, tmp)
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self._sizes[rel] = local.stat().st_size

    def checkpoint(self, uuid: str) -> dict[str, Any]:
        """A checkpoint in the storage, as ``RunReader`` lists one: its size, the
        storage's URL, whether it is committed (``metadata.json``, then read).
        Read again after ``CHECKPOINT_TTL`` seconds (deleted by hand?), or
        ``PERIOD`` while not committed."""
        hit = self._checkpoints.get(uuid)
        if hit is not None and time.monotonic() - hit[0] < (
                CHECKPOINT_TTL if hit[1]["found"] else PERIOD):
            return hit[1]
        storage = f"{self._protocol}://{self.root}"
        where = f"{self.root}/{uuid}"
        try:
            found = self._find(where, None)
            sizes = {"/".join(parts): int(info.get("size") or 0) for _, parts, info in found}
            meta = json.loads(self.fs.cat_file(f"{where}/{METADATA}")) \
                if METADATA in sizes else None
        except Exception:  # noqa: BLE001 (storage down: unknown, never "deleted")
            return {"size": None, "storage": None, "found": False, "metadata": None}
        entry = {"size": sum(sizes.values()) if sizes else None, "storage": storage,
                 "found": meta is not None, "unmarked": meta is None and bool(sizes),
                 "metadata": meta if isinstance(meta, dict) else None}
        self._checkpoints[uuid] = (time.monotonic(), entry)
        return entry

    def follow(self) -> None:
        """Sync every ``PERIOD`` seconds until closed (a background thread)."""
        while not self._stop.wait(PERIOD):
            try:
                self.sync()
                self._error = ""
            except Exception as e:  # noqa: BLE001 (storage down: keep serving the copy)
                error = f"{type(e).__name__}: {_line(e)}"
                if error != self._error:  # one line per new error, not one per period
                    print(f"det-launch ui: PATH {self.url}: {printable(error)}",
                          file=sys.stderr, flush=True)
                self._error = error

    def close(self) -> None:
        self._stop.set()
        shutil.rmtree(self._tmp, ignore_errors=True)


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
