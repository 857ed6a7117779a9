"""Object-storage PATHs (``s3://bucket/prefix``): the runs' records that the
chief synced there (core/_record_sync.py: ``<storage>/runs/<run name>/``),
mirrored into a private local directory which is then served like any other.

Every ``PERIOD`` seconds one listing (a paginated request per 1,000 objects)
finds what changed; a grown stream is fetched from where the mirror's copy
ends (one ranged GET, checked against the copy's last bytes, so its rows are
parsed once, as for a local file); anything else is fetched whole and
replaced atomically. Only record files are mirrored (``*.jsonl`` and the
pointer files), never checkpoints. Credentials come from the storage
library's usual places (environment, config files, instance roles) and are
never printed: errors are one line naming the PATH's printable URL.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
import threading
from typing import Any

from determined_launch.core._record_sync import STORAGE_DIR, is_record
from determined_launch.errors import LaunchError

#: seconds between listings: each costs requests (and money) on a cloud store
PERIOD = 5.0
#: bytes of the mirror's copy compared with the object before appending to it
OVERLAP = 1024


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
        self._tmp = tempfile.mkdtemp(prefix="det-ui-")  # 0700: nobody else reads the copy
        self.local = pathlib.Path(self._tmp) / (self.base.rsplit("/", 1)[-1] or "storage")
        self.local.mkdir()
        self._seen: dict[str, Any] = {}
        self._sizes: dict[str, int] = {}
        self._error = ""
        self._stop = threading.Event()

    def first_sync(self) -> None:
        """The storage root (its ``runs/``, which may appear later: the
        checkpoints are never listed), ``runs/`` itself or one run's prefix."""
        try:
            self.fs.invalidate_cache()
            if not self.base.endswith(f"/{STORAGE_DIR}") and not any(
                    is_record(p.rstrip("/").rsplit("/", 1)[-1]) for p in self._children()):
                self.base = f"{self.base}/{STORAGE_DIR}"
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

    def sync(self) -> None:
        self.fs.invalidate_cache()  # the chief writes: never answer from a listing cache
        try:
            found = self.fs.find(self.base, detail=True)
        except FileNotFoundError:
            return
        for path, info in sorted(found.items()):
            if info.get("type") == "directory" or not path.startswith(self.base + "/"):
                continue
            rel = path[len(self.base) + 1:]
            parts = rel.split("/")
            if len(parts) > 2 or not is_record(parts[-1]) or any(
                    not p or p.startswith(".") for p in parts):
                continue  # a run's records only: <run>/<file> or <file>
            stamp = tuple(info.get(k) for k in ("size", "ETag", "LastModified", "mtime",
                                                 "created"))
            if self._seen.get(rel) != stamp:
                try:
                    self._fetch(path, rel, int(info.get("size") or 0))
                except FileNotFoundError:
                    continue  # deleted since the listing
                self._seen[rel] = stamp

    def _fetch(self, path: str, rel: str, size: int) -> None:
        local = self.local / rel
        local.parent.mkdir(exist_ok=True)
        have = self._sizes.get(rel, 0)
        if rel.endswith(".jsonl") and 0 < have <= size and local.exists():
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

    def follow(self) -> None:
        """Sync every ``PERIOD`` seconds until closed (a background thread)."""
        while not self._stop.wait(PERIOD):
            try:
                self.sync()
                self._error = ""
            except Exception as e:  # noqa: BLE001 (storage down: keep serving the copy)
                error = f"{type(e).__name__}: {_line(e)}"
                if error != self._error:  # one line per new error, not one per period
                    print(f"det-launch ui: PATH {self.url}: {error}", file=sys.stderr,
                          flush=True)
                self._error = error

    def close(self) -> None:
        self._stop.set()
        shutil.rmtree(self._tmp, ignore_errors=True)


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
