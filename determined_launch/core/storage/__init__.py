"""Pluggable checkpoint storage: a directory (rename commit) or object storage
through fsspec (marker commit). See docs/storage.md.

Nothing here imports fsspec or a cloud library until an object store is opened.
"""

from __future__ import annotations

import pathlib
from typing import Any

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
