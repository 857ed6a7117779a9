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
import logging
import pathlib
import threading
from collections.abc import Callable, Mapping
from typing import Optional

from determined_launch.core.storage.base import StorageBackend

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
