"""``CheckpointContext``'s sharded saves: every rank writes its own files into one
checkpoint (``store_path(shard=True)``, ``upload(shard=True)``).

A mixin, like ``_async_save.AsyncSaves``: the storage and the commit stay
``checkpoint.py``'s. The rule that makes it safe is that every rank reaches every
collective here, even one whose block raised, so no rank is left waiting and
either every rank's files are committed together or none are.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional

from determined_launch.core import _ckpt_shard as shard_logic
from determined_launch.core._async_save import user_files as _user_files
from determined_launch.core._dist import Collectives
from determined_launch.core.storage.base import StorageBackend


class ShardedSaves:
    """``CheckpointContext``'s sharded saves (a mixin over its storage and commit)."""

    _dist: Collectives
    _backend: StorageBackend

    def _commit(self, storage_id: str, metadata: Mapping[str, Any],
                files: Mapping[str, int], *, detached: Optional[bool] = None) -> None:
        raise NotImplementedError

    def _begin_sharded(self) -> tuple[str, pathlib.Path, Optional[BaseException]]:
        """Every rank: the shared storage id, this rank's staging directory,
        and an error if this rank cannot see the chief's shared directory."""
        if self._dist.rank == 0:
            storage_id = str(uuid.uuid4())
            staging = self._backend.begin(storage_id)
            self._dist.broadcast(storage_id)
        else:
            storage_id = str(self._dist.broadcast(None))
            staging = (self._backend.staging_dir(storage_id) if self._backend.shared_staging
                       else self._backend.begin(storage_id))
        error: Optional[BaseException] = None
        if not staging.is_dir():
            error = RuntimeError(
                f"checkpoint storage {self._backend.url} is not shared with the chief: "
                f"{staging} does not exist on rank {self._dist.rank}"
            )
        return storage_id, staging, error

    @contextlib.contextmanager
    def _store_sharded(
        self, metadata: Optional[Mapping[str, Any]]
    ) -> Iterator[tuple[pathlib.Path, str]]:
        storage_id, staging, error = self._begin_sharded()
        if error is None:
            try:
                yield staging, storage_id
            except BaseException as e:
                error = e
        # On a shared directory every rank wrote into the same place: the
        # files are already stored and only the chief's commit remains.
        files = {} if self._backend.shared_staging or error else _user_files(staging)
        try:
            self._finish_sharded(storage_id, staging, files, metadata, error)
        finally:
            self._backend.release(storage_id, staging)

    def _finish_sharded(
        self,
        storage_id: str,
        src: Optional[pathlib.Path],
        files: Mapping[str, int],
        metadata: Optional[Mapping[str, Any]],
        error: Optional[BaseException],
    ) -> None:
        """Every rank: agree, upload this rank's files, then the chief commits.

        Every rank reaches every collective here, even one whose block
        raised, so no rank is left waiting.
        """
        reports = self._dist.allgather(
            {"error": None if error is None else repr(error), "files": dict(files),
             "metadata": dict(metadata or {})}
        )
        problem, merged = shard_logic.check_reports(storage_id, reports)
        put_error: Optional[BaseException] = None
        if problem is None and files and src is not None:
            try:
                self._backend.put(storage_id, src, files)
            except Exception as e:
                put_error = e
        uploads = self._dist.allgather(None if put_error is None else repr(put_error))
        outcome: Optional[str] = None
        if self._dist.rank == 0:
            outcome = problem or shard_logic.failed_upload(storage_id, uploads)
            if outcome is None:
                try:
                    self._commit(storage_id, merged, shard_logic.union(reports))
                except Exception as e:
                    outcome = str(e)
            if outcome is not None:
                self._backend.abort(storage_id)
        outcome = self._dist.broadcast(outcome)
        if error is not None:
            raise error
        if put_error is not None:
            raise put_error
        if outcome:
            raise RuntimeError(outcome)

    def _upload_sharded(self, src: Optional[pathlib.Path], metadata: Optional[Mapping[str, Any]],
                        selector: Optional[Callable[[str], bool]]) -> str:
        storage_id, staging, error = self._begin_sharded()
        try:
            return self._upload_sharded_in(storage_id, src, metadata, selector, error)
        finally:
            self._backend.release(storage_id, staging)

    def _upload_sharded_in(self, storage_id: str, src: Optional[pathlib.Path],
                           metadata: Optional[Mapping[str, Any]],
                           selector: Optional[Callable[[str], bool]],
                           error: Optional[BaseException]) -> str:
        uid = None
        if src is not None:
            st = os.stat(src)
            uid = [socket.gethostname(), st.st_dev, st.st_ino]  # a list survives any wire format
        uids = [list(u) if u is not None else None for u in self._dist.allgather(uid)]
        if not any(u is not None for u in uids):
            raise RuntimeError("checkpoint.upload(ckpt_dir=None, shard=True) on every rank "
                               "would upload nothing; at least one rank must pass a directory")
        # Ranks sharing one directory upload it once (the lowest rank), as in Determined.
        mine = src is not None and (selector is not None or uids.index(uid) == self._dist.rank)
        files = _user_files(src, selector) if mine and src is not None and error is None else {}
        self._finish_sharded(storage_id, src, files, metadata, error)
        return storage_id
