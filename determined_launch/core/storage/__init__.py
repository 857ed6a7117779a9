"""Pluggable checkpoint storage: a directory (rename commit) or object storage
through fsspec (marker commit). See docs/storage.md.

Nothing here imports fsspec or a cloud library until an object store is opened.
"""

from __future__ import annotations

import pathlib
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
    if spec is not None and probe and not spec.is_directory:
        open_storage(spec, probe=True)


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
