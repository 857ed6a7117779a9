"""What a checkpoint storage backend does, whatever it stores into.

``CheckpointContext`` handles ranks and metadata; a backend moves files and
owns the commit. Both backends give the same guarantee: a checkpoint is
visible (listed, restorable, returned by ``latest()``) only once committed,
and its ``metadata.json`` exists only in committed checkpoints.
"""

from __future__ import annotations

import contextlib
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any, Optional, Protocol

METADATA_FILE = "metadata.json"
#: Top-level names in storage that are never checkpoints (TensorBoard files, runs' records).
RESERVED_NAMES = frozenset({"tensorboard", "runs"})
PARTIAL_PREFIX = ".partial-"
_STORAGE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: Chooses files by their path relative to the checkpoint root ('a/b.pt').
Selector = Optional[Callable[[str], bool]]


def check_storage_id(storage_id: Any, where: str) -> str:
    """A storage id is one path component; never a leftover or a path."""
    if isinstance(storage_id, str) and storage_id.startswith(PARTIAL_PREFIX):
        raise FileNotFoundError(
            f"checkpoint {storage_id!r} in {where} was never committed "
            "(left by an interrupted save); use a committed id, e.g. latest()"
        )
    if not isinstance(storage_id, str) or not _STORAGE_ID_RE.fullmatch(storage_id):
        raise ValueError(f"invalid checkpoint storage id {storage_id!r}")
    return storage_id


def not_found(storage_id: str, where: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"checkpoint {storage_id} not found in {where} "
        "(never committed, deleted, or a different checkpoint storage)"
    )


def list_local(root: pathlib.Path, selector: Selector = None) -> dict[str, int]:
    """Files under ``root`` as {relative posix path: size}, symlinks followed."""
    out: dict[str, int] = {}
    if root is None or not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        if path.is_file():
            rel = path.relative_to(root).as_posix()
            if selector is None or selector(rel):
                out[rel] = path.stat().st_size
    return out


class StorageBackend(Protocol):
    """The operations ``CheckpointContext`` needs. See ``directory.py`` and
    ``objectstore.py`` for how each commits."""

    #: Printable location (no credentials).
    url: str
    #: True when every rank sees the same staging directory (a shared file
    #: system): ranks then write straight into storage.
    shared_staging: bool

    def staging_dir(self, storage_id: str) -> pathlib.Path:
        """Where this rank writes the files of a checkpoint being saved."""

    def begin(self, storage_id: str) -> pathlib.Path:
        """Chief (or the only writer): prepare a new checkpoint; returns staging_dir."""

    def put(self, storage_id: str, src: pathlib.Path, files: Mapping[str, int]) -> None:
        """Store ``files`` (relative paths under ``src``) into the checkpoint."""

    def commit(self, storage_id: str, metadata: Mapping[str, Any],
               files: Mapping[str, int]) -> None:
        """Check every file in ``files`` is stored, then write the marker."""

    def abort(self, storage_id: str) -> None:
        """Remove what an uncommitted checkpoint left (best effort)."""

    def release(self, storage_id: str, staging: pathlib.Path) -> None:
        """Drop this rank's local staging copy, if it is a copy."""

    def is_committed(self, storage_id: str) -> bool: ...

    def list_ids(self) -> tuple[list[str], list[str]]:
        """(committed ids, ids of uncommitted leftovers)."""

    def get_metadata(self, storage_id: str) -> dict[str, Any]: ...

    def download(self, storage_id: str, dst: pathlib.Path, selector: Selector) -> None: ...

    def restore_path(self, storage_id: str, selector: Selector
                     ) -> contextlib.AbstractContextManager[pathlib.Path]: ...

    def delete(self, storage_id: str, globs: Optional[list[str]]) -> None: ...

    def remove_leftover(self, storage_id: str) -> None: ...

    def put_extra(self, name: str, local: pathlib.Path) -> None:
        """Store a file outside any checkpoint (``tensorboard/...``)."""
