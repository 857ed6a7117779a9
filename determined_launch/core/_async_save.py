"""Background checkpoint saves: at most one in flight, its error never lost.

The caller hands over a consistent copy of its state (files already written
by a ``store_path`` block, or a ``write`` function over data it copied); the
writing, uploading and the commit run on a thread. The commit marker is
written last, by the same backend code as a synchronous save, so a process
killed mid-save leaves only a ``.partial-`` leftover that nothing lists.

The thread is not a daemon: a program that returns without closing its core
context still finishes the save before the interpreter exits.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import pathlib
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional

from determined_launch.core._ckpt_shard import merge_metadata
from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import require_chief
from determined_launch.core.storage.base import (
    METADATA_FILE,
    Selector,
    StorageBackend,
    list_local,
)

logger = logging.getLogger("determined_launch.core")

WriteFn = Callable[[pathlib.Path], object]


class CheckpointSaveError(RuntimeError):
    """A background checkpoint save failed; that checkpoint was not committed."""


def save_error(storage_id: str, error: BaseException) -> CheckpointSaveError:
    return CheckpointSaveError(
        f"the background save of checkpoint {storage_id} failed and it was not committed: "
        f"{type(error).__name__}: {error}"
    )


class SaveFuture(concurrent.futures.Future[str]):
    """The future of a background save; ``storage_id`` is known at once."""

    def __init__(self, storage_id: str) -> None:
        super().__init__()
        self.storage_id = storage_id


class BackgroundSaver:
    """One save at a time on its own thread; ``wait()`` joins it.

    Only the thread that saves calls ``submit`` and ``wait`` (the training
    loop); the save's own thread only runs ``body``.
    """

    def __init__(self) -> None:
        self._pending: Optional[tuple[str, SaveFuture, threading.Thread]] = None

    @property
    def in_flight(self) -> Optional[str]:
        """Storage id of the save not yet waited for, if any."""
        return None if self._pending is None else self._pending[0]

    def submit(self, storage_id: str, body: Callable[[], None]) -> SaveFuture:
        """Start ``body`` on a thread after the previous save finished (its
        error, if any, is raised here and this save does not start)."""
        self.wait()
        future = SaveFuture(storage_id)
        future.set_running_or_notify_cancel()

        def run() -> None:
            try:
                body()
            except BaseException as e:  # handed to whoever waits: never lost
                future.set_exception(e)
            else:
                future.set_result(storage_id)

        thread = threading.Thread(target=run, name=f"checkpoint-save-{storage_id[:8]}")
        self._pending = (storage_id, future, thread)
        thread.start()
        return future

    def wait(self) -> Optional[str]:
        """Wait for the save in flight; its storage id (None if there was none).
        Raises ``CheckpointSaveError`` (one line naming the checkpoint) if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        storage_id, future, thread = pending
        thread.join()
        error = future.exception()
        if error is not None:
            raise save_error(storage_id, error) from error
        return storage_id

    def drain(self) -> Optional[CheckpointSaveError]:
        """At exit: wait, log a failure as one line, and return it (not raised)."""
        try:
            self.wait()
        except CheckpointSaveError as e:
            logger.error("%s", e)
            return e
        return None


def save_body(
    backend: StorageBackend,
    storage_id: str,
    staging: pathlib.Path,
    write: Optional[WriteFn],
    list_files: Callable[[pathlib.Path], Mapping[str, int]],
    commit: Callable[[Mapping[str, int]], None],
) -> Callable[[], None]:
    """What the thread runs: write (if given), store, commit; on any error
    remove the partial checkpoint. The local staging copy is dropped either way."""

    def body() -> None:
        try:
            if write is not None:
                write(staging)
            files = list_files(staging)
            backend.put(storage_id, staging, files)
            commit(files)
        except BaseException:
            backend.abort(storage_id)
            raise
        finally:
            backend.release(storage_id, staging)

    return body


def user_files(root: pathlib.Path, selector: Selector = None) -> dict[str, int]:
    """The user's files; a ``metadata.json`` at the top is ours to write (the marker)."""
    files = list_local(root, selector)
    files.pop(METADATA_FILE, None)
    return files


class AsyncSaves:
    """``CheckpointContext``'s background saves (a mixin over its storage and commit)."""

    _dist: Collectives
    _backend: StorageBackend
    _detached: bool
    _saver: BackgroundSaver

    def _commit(self, storage_id: str, metadata: Mapping[str, Any],
                files: Mapping[str, int], *, detached: Optional[bool] = None) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _store_async(self, metadata: Optional[Mapping[str, Any]]
                     ) -> Iterator[tuple[pathlib.Path, str]]:
        storage_id, staging, commit = self._begin_async(metadata, "store_path(asynchronous=True)")
        try:
            yield staging, storage_id
        except BaseException:
            self._backend.abort(storage_id)
            self._backend.release(storage_id, staging)
            raise
        self._saver.submit(storage_id, save_body(self._backend, storage_id, staging, None,
                                                 user_files, commit))

    def save_async(self, write: WriteFn, metadata: Optional[Mapping[str, Any]] = None
                   ) -> SaveFuture:
        """Chief only: a new checkpoint whose files ``write(path)`` writes on a
        thread, which then uploads and commits it; returns at once a future of
        its storage id (``.storage_id``). ``write`` must read only data the
        caller no longer changes (a copy). One save in flight: this waits for
        the previous one and raises ``CheckpointSaveError`` if it failed (as
        ``wait()`` does; closing the core context logs and raises it)."""
        storage_id, staging, commit = self._begin_async(metadata, "checkpoint.save_async()")
        return self._saver.submit(storage_id, save_body(self._backend, storage_id, staging,
                                                        write, user_files, commit))

    def wait(self) -> Optional[str]:
        """Wait for the background save in flight; its storage id, or None when
        there was none. Raises ``CheckpointSaveError`` if it failed."""
        return self._saver.wait()

    def _drain(self) -> Optional[CheckpointSaveError]:
        """At exit: finish the save in flight; its failure is logged and returned."""
        return self._saver.drain()

    def _begin_async(self, metadata: Optional[Mapping[str, Any]], what: str
                     ) -> tuple[str, pathlib.Path, Any]:
        require_chief(self._dist, what)
        metadata = merge_metadata([metadata or {}])
        self._saver.wait()  # one save in flight; the previous one's error surfaces here
        storage_id = str(uuid.uuid4())
        staging = self._backend.begin(storage_id)
        detached = self._detached  # decided now, not when the thread commits

        def commit(files: Mapping[str, int]) -> None:
            self._commit(storage_id, metadata, files, detached=detached)

        return storage_id, staging, commit

