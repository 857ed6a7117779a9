"""Pluggable checkpoint storage: a directory (rename commit) or object storage
through fsspec (marker commit). See docs/storage.md.

Nothing here imports fsspec or a cloud library until an object store is opened.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, Optional

from determined_launch import envvars
from determined_launch.core.storage.base import METADATA_FILE, PARTIAL_PREFIX, StorageBackend
from determined_launch.core.storage.spec import (
    Retention,
    StorageConfigError,
    StorageSpec,
    parse_storage,
)
from determined_launch.core.storage.transfer import StorageTransferError

__all__ = [
    "METADATA_FILE",
    "PARTIAL_PREFIX",
    "Retention",
    "StorageBackend",
    "StorageConfigError",
    "StorageSpec",
    "StorageTransferError",
    "check_storage",
    "commit_check",
    "configured_storage",
    "open_storage",
    "parse_storage",
]


def open_storage(spec: StorageSpec, *, probe: bool = False, fs: Any = None) -> StorageBackend:
    """The backend for ``spec``. ``probe``: check the bucket and credentials
    now (one request), so a mistake is one line at startup, not a failed save
    hours later. ``fs``: an fsspec filesystem to use instead of building one."""
    if spec.is_directory:
        from determined_launch.core.storage.directory import DirectoryStorage

        return DirectoryStorage(pathlib.Path(spec.root))
    from determined_launch.core.storage.objectstore import ObjectStorage

    backend = ObjectStorage(spec, fs)
    if probe:
        backend.probe()
    return backend


def configured_storage(env: Mapping[str, str], from_info: Any) -> Optional[StorageSpec]:
    """The storage ``DET_CHECKPOINT_STORAGE`` names, else the cluster info's
    ``checkpoint_storage``, else ``None`` (``core.init``'s default directory);
    ``StorageConfigError`` names the origin. ``core.init`` and the launchers read
    it alike, so a launcher can check it before any worker starts."""
    raw = env.get(envvars.CHECKPOINT_STORAGE)
    if raw:
        return parse_storage(raw, where=f"environment variable {envvars.CHECKPOINT_STORAGE}")
    if from_info:
        return parse_storage(from_info, where="cluster info field 'checkpoint_storage'")
    return None


def check_storage(spec: Optional[StorageSpec], *, probe: bool) -> None:
    """What a launcher checks before its workers start, given a parsed storage
    (its extra is installed, its block valid): with ``probe`` (the chief), that
    the bucket answers. A mistake is one ``StorageConfigError`` line instead of
    a traceback per rank."""
    if spec is None or not probe:
        return
    if spec.is_directory:
        _check_writable(pathlib.Path(spec.root))
    else:
        open_storage(spec, probe=True)


def _check_writable(root: pathlib.Path) -> None:
    """An unwritable place is one line now, not a chained traceback per rank at the
    first save, hours in. Nothing is left behind (``--dry-run`` too): an existing
    directory gets a file created and removed; else its nearest existing parent
    must be a directory we may create it in."""
    problem = ""
    try:
        if root.is_dir():
            fd, name = tempfile.mkstemp(prefix=".det-write-check-", dir=root)
            os.close(fd)
            os.unlink(name)
        else:
            parent = next(p for p in (root, *root.parents) if p.exists())
            if parent is root or not parent.is_dir():
                problem = f"{parent} is not a directory"
            elif not os.access(parent, os.W_OK | os.X_OK):
                problem = f"cannot create directories in {parent}"
    except OSError as e:
        problem = str(e.strerror or e)
    if problem:
        raise StorageConfigError(
            f"checkpoint storage {root} (DET_CHECKPOINT_STORAGE or a checkpoint_storage "
            f"block): cannot write there: {problem}")


def commit_check(env: Mapping[str, str], from_info: Any) -> Callable[[str], bool]:
    """The commit-marker check a resume point needs on object storage, where a
    pointer's ``pending`` checkpoint may be committed or not (as
    ``checkpoint.latest()`` checks it). ``from_info``: the cluster info's
    ``checkpoint_storage``. The storage is opened only if a rerun's pointer
    asks, and once."""
    opened: list[StorageBackend] = []

    def is_committed(storage_id: str) -> bool:
        if not opened:
            spec = configured_storage(env, from_info)
            if spec is None:
                return False
            opened.append(open_storage(spec))
        return bool(opened[0].is_committed(storage_id))

    return is_committed
