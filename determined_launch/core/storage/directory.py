"""Checkpoints in a directory (local or a shared file system), committed by rename.

Layout::

    <storage>/<storage_id>/            a committed checkpoint: your files + metadata.json
    <storage>/.partial-<storage_id>/   a checkpoint being written (or abandoned by a crash)

A checkpoint is written into its ``.partial-`` directory and becomes visible
under its storage id only by one ``rename`` once every writer has finished
and ``metadata.json`` is in place. Ranks write straight into the shared
``.partial-`` directory: nothing is copied.

The files and their directories are flushed to disk (``fsync``) before
``metadata.json`` is written: without it a machine that crashes or loses power
after the rename can come back with a committed-looking checkpoint whose files
are empty or cut (the page cache is written back later, in any order), and a
rerun would resume from it. PyTorch's distributed checkpoint writer does the
same by default. The cost is the disk's write time, inside a synchronous save's
pause; an asynchronous save pays it on its thread.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import pathlib
import shutil
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from determined_launch.core._rundir import dumps, write_atomically
from determined_launch.core.storage.base import (
    METADATA_FILE,
    PARTIAL_PREFIX,
    Selector,
    check_storage_id,
    list_local,
    not_found,
)


class DirectoryStorage:
    shared_staging = True

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.url = str(root)

    def staging_dir(self, storage_id: str) -> pathlib.Path:
        return self.root / f"{PARTIAL_PREFIX}{storage_id}"

    def begin(self, storage_id: str) -> pathlib.Path:
        partial = self.staging_dir(storage_id)
        partial.mkdir(parents=True)
        return partial

    def put(self, storage_id: str, src: pathlib.Path, files: Mapping[str, int]) -> None:
        dst = self.staging_dir(storage_id)
        if src.resolve() == dst.resolve():
            return  # written in place by store_path
        for rel in files:
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, target)

    def commit(self, storage_id: str, metadata: Mapping[str, Any],
               files: Mapping[str, int]) -> None:
        partial = self.staging_dir(storage_id)
        missing = sorted(rel for rel in files if not (partial / rel).is_file())
        if missing:
            raise RuntimeError(
                f"checkpoint {storage_id} was not committed: {missing[0]} is missing from "
                f"{partial} (is {self.root} shared by every node?)"
            )
        _fsync_files(partial, files)
        write_atomically(partial / METADATA_FILE, dumps(dict(metadata)) + "\n")
        os.rename(partial, self.root / storage_id)
        _fsync_dir(self.root)

    def abort(self, storage_id: str) -> None:
        shutil.rmtree(self.staging_dir(storage_id), ignore_errors=True)

    def release(self, storage_id: str, staging: pathlib.Path) -> None:
        """Staging is the storage itself: nothing to drop."""

    def _committed(self, storage_id: str) -> pathlib.Path:
        check_storage_id(storage_id, self.url)
        path = self.root / storage_id
        if not (path / METADATA_FILE).is_file():
            raise not_found(storage_id, self.url)
        return path

    def is_committed(self, storage_id: str) -> bool:
        try:
            self._committed(storage_id)
        except (FileNotFoundError, ValueError):
            return False
        return True

    def list_ids(self) -> tuple[list[str], list[str]]:
        committed: list[str] = []
        leftovers: list[str] = []
        if not self.root.is_dir():
            return committed, leftovers
        for entry in sorted(self.root.iterdir()):
            if not entry.is_dir():
                continue
            if entry.name.startswith(PARTIAL_PREFIX):
                leftovers.append(entry.name[len(PARTIAL_PREFIX):])
            elif (entry / METADATA_FILE).is_file():
                committed.append(entry.name)
        return committed, leftovers

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        with open(self._committed(storage_id) / METADATA_FILE, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}

    def download(self, storage_id: str, dst: pathlib.Path, selector: Selector) -> None:
        src = self._committed(storage_id)
        if selector is None:
            shutil.copytree(src, dst, dirs_exist_ok=True)
            return
        for rel in list_local(src, selector):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)

    @contextlib.contextmanager
    def restore_path(self, storage_id: str, selector: Selector) -> Iterator[pathlib.Path]:
        """The checkpoint itself (shared storage, nothing to download): read, don't modify."""
        yield self._committed(storage_id)

    def delete(self, storage_id: str, globs: Optional[list[str]]) -> None:
        path = self._committed(storage_id)
        if globs is None or "**/*" in globs:
            # Uncommit first (rename back to .partial-), so a crash mid-delete
            # never leaves a damaged checkpoint visible.
            doomed = self.staging_dir(storage_id)
            os.rename(path, doomed)
            shutil.rmtree(doomed)
            return
        for rel in list_local(path):
            if rel != METADATA_FILE and any(fnmatch.fnmatch(rel, g) for g in globs):
                (path / rel).unlink()

    def remove_leftover(self, storage_id: str) -> None:
        check_storage_id(storage_id, self.url)
        shutil.rmtree(self.staging_dir(storage_id))

    def put_extra(self, name: str, local: pathlib.Path) -> None:
        target = self.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copy2(local, tmp)
        os.replace(tmp, target)


def _fsync_files(root: pathlib.Path, files: Mapping[str, int]) -> None:
    """Each file's data, then the directories that name them, on disk."""
    dirs = {root}
    for rel in files:
        path = root / rel
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dirs.update(p for p in path.parents if p != root and root in p.parents)
    for d in sorted(dirs, key=lambda p: -len(p.parts)):  # deepest first
        _fsync_dir(d)


def _fsync_dir(path: pathlib.Path) -> None:
    """Make a rename durable; some file systems refuse, which is fine."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
