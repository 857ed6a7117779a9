"""``core_context.checkpoint``: checkpoints in a shared directory, committed atomically.

Layout of the storage directory::

    <storage>/<storage_id>/            a committed checkpoint: your files + metadata.json
    <storage>/.partial-<storage_id>/   a checkpoint being written (or abandoned by a crash)

A checkpoint is written into its ``.partial-`` directory and becomes visible
under its storage id only by one ``rename`` once every writer has finished
and ``metadata.json`` is in place. A crash at any earlier point leaves only
a ``.partial-`` directory, which ``restore_path``, ``get_metadata`` and
``latest`` never return. The storage directory must be shared by every node
whose ranks write shards or restore (a network file system); only the chief
writes in the default, unsharded mode.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir, dumps, require_chief, write_atomically

logger = logging.getLogger("determined_launch.core")

METADATA_FILE = "metadata.json"
PARTIAL_PREFIX = ".partial-"
#: Run-directory pointer to the newest checkpoint this run committed.
LATEST_POINTER = "latest_checkpoint"

_STORAGE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class CheckpointConflictError(ValueError):
    """Sharded ranks gave different values for the same metadata key."""


def merge_metadata(all_metadata: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Union of every rank's metadata; nested dicts merge key by key.

    Equal values under one key are fine (every rank may report
    ``steps_completed``); different ones raise ``CheckpointConflictError``
    naming the key, because silently picking one would lose information.
    """

    def merge(into: dict[str, Any], new: Mapping[str, Any], where: str) -> None:
        for key, value in new.items():
            if key not in into:
                into[key] = value
            elif isinstance(into[key], dict) and isinstance(value, Mapping):
                merge(into[key], value, f"{where}{key}.")
            elif into[key] != value:
                raise CheckpointConflictError(
                    f"sharded checkpoint metadata conflict at {where}{key!s}: "
                    f"{into[key]!r} != {value!r}"
                )

    out: dict[str, Any] = {}
    for md in all_metadata:
        merge(out, json.loads(dumps(dict(md))), "")
    return out


class CheckpointContext:
    """Local stand-in for Determined's ``CheckpointContext`` on a shared directory."""

    def __init__(self, dist: Collectives, storage: pathlib.Path, run_dir: RunDir) -> None:
        self._dist = dist
        self._storage = storage
        self._run_dir = run_dir

    @property
    def storage_dir(self) -> pathlib.Path:
        return self._storage

    # --- writing -----------------------------------------------------------

    def store_path(
        self, metadata: Optional[Mapping[str, Any]] = None, *, shard: bool = False
    ) -> contextlib.AbstractContextManager[tuple[pathlib.Path, str]]:
        """Context manager yielding ``(path, storage_id)``: save your files into ``path``.

        On a clean exit ``metadata`` is written to ``metadata.json`` and the
        checkpoint is committed; if the block raises, nothing is committed
        and the partial files are removed.

        ``shard=False`` (default): only the chief may call it.

        ``shard=True``: every rank must call it (it is a synchronization
        point). All ranks get the same ``path``, each writes its own files
        (give them rank-specific names), and the chief commits after every
        rank has left the block. Metadata from all ranks is merged. If any
        rank's block raised, no rank commits: that rank re-raises its error
        and the others raise ``RuntimeError``.
        """
        if shard:
            return self._store_sharded(metadata)
        return self._store_single(metadata)

    @contextlib.contextmanager
    def _store_single(
        self, metadata: Optional[Mapping[str, Any]]
    ) -> Iterator[tuple[pathlib.Path, str]]:
        require_chief(self._dist, "checkpoint.store_path(shard=False)")
        metadata = merge_metadata([metadata or {}])  # fail early on unserializable metadata
        storage_id, partial = self._begin()
        try:
            yield partial, storage_id
            self._commit(storage_id, partial, metadata)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise

    @contextlib.contextmanager
    def _store_sharded(
        self, metadata: Optional[Mapping[str, Any]]
    ) -> Iterator[tuple[pathlib.Path, str]]:
        if self._dist.rank == 0:
            storage_id, partial = self._begin()
            self._dist.broadcast(storage_id)
        else:
            storage_id = str(self._dist.broadcast(None))
            partial = self._partial_dir(storage_id)

        error: Optional[BaseException] = None
        if not partial.is_dir():
            error = RuntimeError(
                f"checkpoint storage {self._storage} is not shared with the chief: "
                f"{partial} does not exist on rank {self._dist.rank}"
            )
        else:
            try:
                yield partial, storage_id
            except BaseException as e:
                error = e

        # Every rank reaches this point, even one whose block raised, so no
        # rank is left waiting in a collective.
        reports = self._dist.allgather(
            {"ok": error is None, "error": repr(error), "metadata": dict(metadata or {})}
        )
        outcome: Optional[str] = None
        if self._dist.rank == 0:
            outcome = self._finish_sharded(storage_id, partial, reports)
        outcome = self._dist.broadcast(outcome)
        if error is not None:
            raise error
        if outcome:
            raise RuntimeError(outcome)

    def _finish_sharded(
        self, storage_id: str, partial: pathlib.Path, reports: list[Mapping[str, Any]]
    ) -> Optional[str]:
        """Chief: commit if every rank succeeded; else a reason for the others."""
        failed = [(rank, r["error"]) for rank, r in enumerate(reports) if not r["ok"]]
        try:
            if failed:
                rank, err = failed[0]
                raise RuntimeError(
                    f"checkpoint {storage_id} was not committed: rank {rank} failed with {err}"
                )
            self._commit(storage_id, partial, merge_metadata([r["metadata"] for r in reports]))
        except Exception as e:
            shutil.rmtree(partial, ignore_errors=True)
            return str(e)
        return None

    def upload(
        self,
        ckpt_dir: os.PathLike[str] | str,
        metadata: Optional[Mapping[str, Any]] = None,
        *,
        shard: bool = False,
    ) -> str:
        """Copy the files of ``ckpt_dir`` into a new checkpoint; returns its storage id."""
        with self.store_path(metadata, shard=shard) as (path, storage_id):
            shutil.copytree(ckpt_dir, path, dirs_exist_ok=True)
        return storage_id

    def _begin(self) -> tuple[str, pathlib.Path]:
        storage_id = str(uuid.uuid4())
        partial = self._partial_dir(storage_id)
        partial.mkdir(parents=True)
        return storage_id, partial

    def _commit(self, storage_id: str, partial: pathlib.Path, metadata: Mapping[str, Any]) -> None:
        write_atomically(partial / METADATA_FILE, dumps(dict(metadata)) + "\n")
        os.rename(partial, self._storage / storage_id)
        _fsync_dir(self._storage)
        self._run_dir.write_pointer(
            LATEST_POINTER,
            {"storage_id": storage_id, "trial_id": self._run_dir.trial_id,
             "hparams": self._run_dir.hparams, "metadata": dict(metadata)},
        )
        logger.info("committed checkpoint %s (metadata=%s)", storage_id, dict(metadata))

    def _partial_dir(self, storage_id: str) -> pathlib.Path:
        return self._storage / f"{PARTIAL_PREFIX}{storage_id}"

    # --- reading -----------------------------------------------------------

    def _committed(self, storage_id: str) -> pathlib.Path:
        if isinstance(storage_id, str) and storage_id.startswith(PARTIAL_PREFIX):
            # What a crashed upload left: never a checkpoint (README, "Checkpoints").
            raise FileNotFoundError(
                f"checkpoint {storage_id!r} in {self._storage} was never committed "
                "(left by an interrupted save); use a committed id, e.g. latest()"
            )
        if not isinstance(storage_id, str) or not _STORAGE_ID_RE.fullmatch(storage_id):
            raise ValueError(f"invalid checkpoint storage id {storage_id!r}")
        path = self._storage / storage_id
        if not (path / METADATA_FILE).is_file():
            raise FileNotFoundError(
                f"checkpoint {storage_id} not found in {self._storage} "
                "(never committed, deleted, or a different checkpoint storage)"
            )
        return path

    @contextlib.contextmanager
    def restore_path(self, storage_id: str) -> Iterator[pathlib.Path]:
        """Context manager yielding the directory of a committed checkpoint.

        Storage is a shared directory, so nothing is downloaded and the path
        is the checkpoint itself: read it, do not modify it.
        """
        yield self._committed(storage_id)

    def download(self, storage_id: str, ckpt_dir: os.PathLike[str] | str) -> None:
        """Copy a committed checkpoint's files (with ``metadata.json``) into ``ckpt_dir``."""
        shutil.copytree(self._committed(storage_id), ckpt_dir, dirs_exist_ok=True)

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        with open(self._committed(storage_id) / METADATA_FILE, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}

    def latest(self) -> Optional[str]:
        """Storage id of the newest checkpoint this run directory committed.

        Off-cluster nothing passes ``latest_checkpoint`` to a rerun, so a
        rerun with the same run directory resumes with
        ``info.latest_checkpoint or core_context.checkpoint.latest()``.
        ``None`` if none was committed, or it has been deleted since.
        """
        pointer = self._run_dir.read_pointer(LATEST_POINTER)
        storage_id = pointer.get("storage_id") if pointer else None
        if not isinstance(storage_id, str):
            return None
        try:
            self._committed(storage_id)
        except (FileNotFoundError, ValueError):
            return None
        return storage_id

    def delete(self, storage_id: str) -> None:
        """Remove a committed checkpoint: first uncommit it (rename back to
        ``.partial-``), so a crash mid-delete never leaves a damaged one visible."""
        path = self._committed(storage_id)
        doomed = self._partial_dir(storage_id)
        os.rename(path, doomed)
        shutil.rmtree(doomed)


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
