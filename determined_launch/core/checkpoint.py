"""``core_context.checkpoint``: checkpoints in any storage, committed atomically.

This module handles ranks and metadata; the storage backend
(``core/storage/``) moves files and owns the commit: a rename on file
systems, ``metadata.json`` written last on object stores. Either way a
checkpoint is visible (listed, restorable, ``latest()``) only once committed.

The run directory's ``latest_checkpoint.json`` names the newest checkpoint
this run committed. It is written twice around each commit: first with the
new id as ``pending`` (beside the previous committed ``storage_id``), then
with the new id as ``storage_id``; ``checkpoints.jsonl`` lists every one. Which
of them a rerun resumes is ``determined_launch/rundir.py``'s rule (the newest
with its commit marker), the same for ``latest()`` and the launcher.

Background saves (``save_async``, ``store_path(asynchronous=True)``) live in
``_async_save.py``: the same commit, on a thread, one save at a time. Sharded
saves (``shard=True``, every rank's files in one checkpoint) live in
``_sharded_save.py``.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import pathlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional

from determined_launch import rundir
from determined_launch.core import _ckpt_shard as shard_logic
from determined_launch.core._async_save import (
    AsyncSaves,
    BackgroundSaver,
    CheckpointSaveError,
)
from determined_launch.core._async_save import user_files as _user_files
from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir, require_chief
from determined_launch.core._sharded_save import ShardedSaves
from determined_launch.core.storage.base import (
    METADATA_FILE,
    PARTIAL_PREFIX,
    StorageBackend,
    check_storage_id,
)
from determined_launch.core.storage.directory import DirectoryStorage

logger = logging.getLogger("determined_launch.core")

__all__ = ["METADATA_FILE", "PARTIAL_PREFIX", "CheckpointContext", "CheckpointSaveError",
           "DownloadMode", "merge_metadata"]

#: Run-directory pointer to the newest checkpoint this run committed.
LATEST_POINTER = rundir.POINTER
CheckpointConflictError = shard_logic.CheckpointConflictError
merge_metadata = shard_logic.merge_metadata


class DownloadMode(enum.Enum):
    """How ``download()`` and ``restore_path()`` coordinate (Determined's names).

    ``LocalWorkersShareDownload`` (default): on object storage, every worker
    calls in step and one worker per node downloads. ``NoSharedDownload``: no
    coordination; each caller downloads what it asks for. A directory storage
    downloads nothing for ``restore_path`` in either mode.
    """

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


class CheckpointContext(AsyncSaves, ShardedSaves):
    """Local stand-in for Determined's ``CheckpointContext``, on any storage backend."""

    def __init__(
        self,
        dist: Collectives,
        storage: StorageBackend | pathlib.Path,
        run_dir: RunDir,
        *,
        after_commit: Optional[Callable[[str, Mapping[str, Any]], None]] = None,
        resolved_latest: Optional[tuple[Optional[str]]] = None,
    ) -> None:
        self._dist = dist
        self._backend: StorageBackend = (
            DirectoryStorage(storage) if isinstance(storage, pathlib.Path) else storage
        )
        self._run_dir = run_dir
        #: Called on the chief after each commit (retention, TensorBoard sync).
        self._after_commit = after_commit
        #: Commits stay out of the run's lineage (``outside_lineage``).
        self._detached = False
        #: ``(info.latest_checkpoint,)`` when a launcher (or core.init's own
        #: resolution) decided the resume point: ``latest()`` answers it until
        #: this run commits, so the Trainer's "latest" is the launcher's (--fresh too)
        self._resolved_latest = resolved_latest
        #: The background save in flight (``asynchronous=True``, ``save_async``).
        self._saver = BackgroundSaver()

    @contextlib.contextmanager
    def outside_lineage(self) -> Iterator[None]:
        """Checkpoints committed in this block are not the run's: the pointer a
        rerun resumes from, the run's log and retention ignore them (test mode,
        which must never become the newest checkpoint of the real run)."""
        self._detached = True
        try:
            yield
        finally:
            self._detached = False

    @property
    def storage_dir(self) -> Optional[pathlib.Path]:
        """The storage directory, or ``None`` for object storage (see ``storage_url``)."""
        backend = self._backend
        return backend.root if isinstance(backend, DirectoryStorage) else None

    @property
    def storage_url(self) -> str:
        return self._backend.url

    @property
    def backend(self) -> StorageBackend:
        return self._backend

    # --- writing -----------------------------------------------------------

    def store_path(
        self, metadata: Optional[Mapping[str, Any]] = None, *, shard: bool = False,
        asynchronous: bool = False,
    ) -> contextlib.AbstractContextManager[tuple[pathlib.Path, str]]:
        """Context manager yielding ``(path, storage_id)``: save your files into ``path``.

        On a clean exit ``metadata`` is written to ``metadata.json`` and the
        checkpoint is committed; if the block raises, nothing is committed
        and the partial files are removed.

        ``shard=False`` (default): only the chief may call it.

        ``shard=True``: every rank must call it (it is a synchronization
        point). Each rank writes its own files (give them rank-specific
        names): on a shared directory all ranks get the same ``path``; on
        object storage each rank gets a local directory that is uploaded
        when the block exits. The chief commits after every rank's files
        are stored. Metadata from all ranks is merged. If any rank's block
        raised, no rank commits: that rank re-raises its error and the
        others raise ``RuntimeError``.

        ``asynchronous=True`` (chief only, not with ``shard``): the block's
        files are the consistent copy; the upload and the commit run on a
        thread after the block exits (see ``save_async``). On a directory
        storage the files are written in place, so only the commit is deferred.
        """
        if asynchronous:
            if shard:
                raise ValueError("checkpoint.store_path(shard=True, asynchronous=True): sharded "
                                 "saves are synchronous; drop one of the two")
            return self._store_async(metadata)
        if shard:
            return self._store_sharded(metadata)
        return self._store_single(metadata, "checkpoint.store_path(shard=False)")

    @contextlib.contextmanager
    def _store_single(
        self, metadata: Optional[Mapping[str, Any]], what: str
    ) -> Iterator[tuple[pathlib.Path, str]]:
        require_chief(self._dist, what)
        metadata = merge_metadata([metadata or {}])  # fail early on unserializable metadata
        self._saver.wait()  # a background save in flight finishes (or fails) first
        storage_id = str(uuid.uuid4())
        staging = self._backend.begin(storage_id)
        try:
            yield staging, storage_id
            files = _user_files(staging)
            self._backend.put(storage_id, staging, files)
            self._commit(storage_id, metadata, files)
        except BaseException:
            self._backend.abort(storage_id)
            raise
        finally:
            self._backend.release(storage_id, staging)

    def upload(
        self,
        ckpt_dir: Optional[os.PathLike[str] | str],
        metadata: Optional[Mapping[str, Any]] = None,
        *,
        shard: bool = False,
        selector: Optional[Callable[[str], bool]] = None,
    ) -> str:
        """Store the files of ``ckpt_dir`` as a new checkpoint; returns its storage id.

        ``selector`` chooses files by their path relative to ``ckpt_dir``.
        ``shard=True``: every rank calls it; ranks with nothing to upload
        pass ``ckpt_dir=None``; ranks of one node passing the same directory
        without a selector upload it once. Two ranks uploading the same file
        is an error and nothing is committed.
        """
        src = pathlib.Path(ckpt_dir) if ckpt_dir is not None else None
        if not shard:
            require_chief(self._dist, "checkpoint.upload(shard=False)")
            if src is None:
                raise RuntimeError("checkpoint.upload(ckpt_dir=None, shard=False) would upload "
                                   "nothing; pass a directory")
            metadata = merge_metadata([metadata or {}])
            storage_id = str(uuid.uuid4())
            files = _user_files(src, selector)
            try:
                if self._backend.shared_staging:
                    self._backend.begin(storage_id)
                self._backend.put(storage_id, src, files)
                self._commit(storage_id, metadata, files)
            except BaseException:
                self._backend.abort(storage_id)
                raise
            return storage_id
        return self._upload_sharded(src, metadata, selector)

    def _commit(self, storage_id: str, metadata: Mapping[str, Any],
                files: Mapping[str, int], *, detached: Optional[bool] = None) -> None:
        if self._detached if detached is None else detached:
            self._backend.commit(storage_id, metadata, files)
            logger.info("committed checkpoint %s to %s outside this run's lineage (a rerun does "
                        "not resume from it)", storage_id, self._backend.url)
            return
        previous = self.latest()
        identity = self._run_dir.identity.fields()
        self._run_dir.write_pointer(LATEST_POINTER, {**identity, "storage_id": previous,
                                                     "pending": storage_id})
        self._backend.commit(storage_id, metadata, files)
        self._resolved_latest = None  # this run's own checkpoints from now on
        self._run_dir.write_pointer(
            LATEST_POINTER, {**identity, "storage_id": storage_id, "metadata": dict(metadata)})
        logger.info("committed checkpoint %s to %s (metadata=%s)", storage_id,
                    self._backend.url, dict(metadata))
        if self._after_commit is not None:
            try:  # committed: its log line or retention must never fail the save
                self._after_commit(storage_id, metadata)
            except Exception as e:
                logger.warning("checkpoint %s is committed, but the run directory's log or "
                               "retention failed: %s", storage_id, e)

    # --- reading -----------------------------------------------------------

    def _shared_download(self, mode: Any, selector: Optional[Callable[[str], bool]]) -> bool:
        """Whether this call coordinates: Determined's default on storage that
        must be downloaded, by every rank, in step."""
        mode = DownloadMode(mode)
        if mode is DownloadMode.NoSharedDownload or self._backend.shared_staging:
            return False
        return self._dist.size > 1

    @contextlib.contextmanager
    def restore_path(
        self,
        storage_id: str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Optional[Callable[[str], bool]] = None,
    ) -> Iterator[pathlib.Path]:
        """Context manager yielding a local directory with a committed checkpoint.

        On a directory storage the path is the checkpoint itself (read it,
        do not modify it). On object storage it is a private temporary
        download, removed afterwards; with ``LocalWorkersShareDownload``
        every rank calls in step and one rank per node downloads.
        """
        if not self._shared_download(download_mode, selector):
            with self._backend.restore_path(storage_id, selector) as path:
                yield path
            return
        with shard_logic.node_shared(self._dist, selector, lambda sel: self._backend.restore_path(
                storage_id, sel)) as path:
            yield path

    def download(
        self,
        storage_id: str,
        ckpt_dir: os.PathLike[str] | str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Optional[Callable[[str], bool]] = None,
    ) -> None:
        """Copy a committed checkpoint's files (with ``metadata.json``) into ``ckpt_dir``."""
        dst = pathlib.Path(ckpt_dir)
        if not self._shared_download(download_mode, selector):
            self._backend.download(storage_id, dst, selector)
            return
        shard_logic.node_shared_download(
            self._dist, dst, selector, lambda d, sel: self._backend.download(storage_id, d, sel))

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        return self._backend.get_metadata(storage_id)

    def latest(self) -> Optional[str]:
        """Storage id of the newest committed checkpoint of this run.

        The resume point the launcher announced (``info.latest_checkpoint``;
        none after ``--fresh``) until this run commits one; then, and without a
        launcher's decision, ``rundir.newest_committed``: the newest
        checkpoint of this run (same trial, hyperparameters and command) whose
        commit marker exists. ``None`` if there is none.
        """
        if self._resolved_latest is not None:
            hint = self._resolved_latest[0]
            if hint is None or self._backend.is_committed(hint):
                return hint
        return rundir.newest_committed(self._run_dir.path, self._run_dir.identity,
                                       self._backend.is_committed).storage_id

    def committed_ids(self) -> list[str]:
        """Storage ids of every committed checkpoint in this storage."""
        return self._backend.list_ids()[0]

    def delete(self, storage_id: str, globs: Optional[list[str]] = None) -> None:
        """Remove a committed checkpoint (all of it, or the files matching
        ``globs``, e.g. ``["optimizer/*"]``). Removing all of it uncommits it
        first, so a crash mid-delete never leaves a damaged one visible."""
        check_storage_id(storage_id, self._backend.url)
        self._backend.delete(storage_id, globs)
        if not globs and self._dist.rank == 0:  # deleted on purpose: never "skipped"
            self._run_dir.append(rundir.CHECKPOINT_LOG, {"deleted": storage_id})
