"""Parallel file transfers with bounded retries and a progress line.

Each file is one task; the storage library streams it from disk (s3fs and
adlfs split large files into parts and send them concurrently), so a large
checkpoint never sits whole in memory. A task that fails is retried with
exponential backoff a bounded number of times; then the whole transfer
fails with one line naming the checkpoint, the URL and the last error, so a
training process never hangs on a dead server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Optional

logger = logging.getLogger("determined_launch.core")

#: Attempts per file (first try + retries); DET_STORAGE_RETRIES overrides.
DEFAULT_ATTEMPTS = 5
RETRIES_ENV = "DET_STORAGE_RETRIES"
#: Files in flight at once; DET_STORAGE_PARALLEL overrides. Async filesystems
#: (s3fs, gcsfs, adlfs) run them as coroutines on their event loop, others
#: on threads (at most 16).
DEFAULT_PARALLEL = 16
PARALLEL_ENV = "DET_STORAGE_PARALLEL"
_MAX_THREADS = 16
#: A transfer running longer than this prints a progress line, then every PROGRESS_EVERY.
PROGRESS_AFTER = 3.0
PROGRESS_EVERY = 5.0
_BACKOFF_BASE = 0.2
_BACKOFF_MAX = 5.0


class StorageTransferError(RuntimeError):
    """A transfer failed after its retries."""


class Exhausted(Exception):
    """A piece of a file (a multipart part) already failed after its own retries:
    the file is not retried again. ``cause`` is the last error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _env_int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise StorageTransferError(
            f"environment variable {name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise StorageTransferError(f"environment variable {name}={raw!r}: must be >= {minimum}")
    return value


def attempts() -> int:
    return _env_int(RETRIES_ENV, DEFAULT_ATTEMPTS, 1)


def parallel() -> int:
    return _env_int(PARALLEL_ENV, DEFAULT_PARALLEL, 1)


#: Not retried: a missing local file or refused credentials will not heal; an
#: ``Exhausted`` piece was already retried on its own.
_FINAL = (FileNotFoundError, PermissionError, Exhausted)


def _backoff(e: Exception, attempt: int, tries: int, what: str) -> float:
    """The delay before attempt ``attempt + 1`` after ``e``; re-raises ``e``
    when it is final or was the last attempt."""
    if isinstance(e, _FINAL) or attempt == tries:
        raise e
    delay = min(_BACKOFF_MAX, _BACKOFF_BASE * 2 ** (attempt - 1))
    logger.warning("%s failed (%s: %s); retry %d/%d in %.1f s", what,
                   type(e).__name__, _first_line(e), attempt, tries - 1, delay)
    return delay


def with_retries(fn: Callable[[], object], what: str, *, tries: Optional[int] = None) -> None:
    """Run ``fn``; retry on any exception with backoff; re-raise the last one."""
    tries = tries or attempts()
    for attempt in range(1, tries + 1):
        try:
            fn()
            return
        except Exception as e:
            time.sleep(_backoff(e, attempt, tries, what))


async def retry_async(make: Callable[[], Awaitable[Any]], what: str, *,
                      tries: Optional[int] = None) -> Any:
    """``with_retries`` for a coroutine factory: await ``make()``, retrying with
    backoff; return its result or re-raise the last error."""
    tries = tries or attempts()
    for attempt in range(1, tries + 1):
        try:
            return await make()
        except Exception as e:
            await asyncio.sleep(_backoff(e, attempt, tries, what))
    raise AssertionError("unreachable")  # tries >= 1


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class _Progress:
    """Logs 'verb label: done/total MB (files), rate' for long transfers only."""

    def __init__(self, verb: str, label: str, total_bytes: int, total_files: int) -> None:
        self.verb, self.label = verb, label
        self.total_bytes, self.total_files = total_bytes, total_files
        self.done_bytes = self.done_files = 0
        self.start = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="det-storage-progress")
        self._thread.start()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done_bytes += nbytes
            self.done_files += 1

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-6)
        mb = 1024 * 1024
        return (f"{self.verb} {self.label}: {self.done_bytes / mb:.0f}/{self.total_bytes / mb:.0f}"
                f" MB, {self.done_files}/{self.total_files} files, "
                f"{self.done_bytes / mb / elapsed:.0f} MB/s")

    def _run(self) -> None:
        if self._stop.wait(PROGRESS_AFTER):
            return
        while True:
            logger.info("%s", self.line())
            if self._stop.wait(PROGRESS_EVERY):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def run_parallel(
    tasks: Sequence[tuple[str, int, Callable[[], object]]],
    *,
    verb: str,
    label: str,
    url: str,
) -> None:
    """Run ``(name, size, fn)`` tasks in parallel, each with retries.

    The first task that exhausts its retries cancels those not started and
    raises ``StorageTransferError``: '<verb> <label> to/from <url>: <name>: <error>'.
    """
    if not tasks:
        return
    progress = _Progress(verb, label, sum(t[1] for t in tasks), len(tasks))
    tries = attempts()
    try:
        workers = min(parallel(), _MAX_THREADS, len(tasks))
        with concurrent.futures.ThreadPoolExecutor(workers, "det-storage") as pool:
            futures = {}
            for name, size, fn in tasks:
                fut = pool.submit(with_retries, fn, f"{verb} {name}", tries=tries)
                futures[fut] = (name, size)
            for fut in concurrent.futures.as_completed(futures):
                name, size = futures[fut]
                err = fut.exception()
                if err is not None:
                    for other in futures:
                        other.cancel()
                    raise StorageTransferError(
                        f"{verb} checkpoint {label} at {url} failed after {tries} attempt(s): "
                        f"{name}: {type(err).__name__}: {_first_line(err)}"
                    ) from err
                progress.add(size)
    finally:
        progress.close()


def run_async(
    fs: Any,
    tasks: Sequence[tuple[str, int, Callable[[], Awaitable[Any]]]],
    *,
    verb: str,
    label: str,
    url: str,
) -> None:
    """``run_parallel`` for an async fsspec filesystem: every task is a
    coroutine on the filesystem's own event loop (as s3fs's ``put``/``get``
    run), up to ``parallel()`` at once, each with the same bounded retries."""
    from fsspec.asyn import sync

    if not tasks:
        return
    tries = attempts()
    progress = _Progress(verb, label, sum(t[1] for t in tasks), len(tasks))

    async def one(gate: asyncio.Semaphore, name: str, size: int,
                  make: Callable[[], Awaitable[Any]]) -> None:
        async with gate:
            await retry_async(make, f"{verb} {name}", tries=tries)
        progress.add(size)

    async def everything() -> list[Any]:
        gate = asyncio.Semaphore(parallel())
        return await asyncio.gather(*(one(gate, *t) for t in tasks), return_exceptions=True)

    try:
        results = sync(fs.loop, everything)
    finally:
        progress.close()
    for (name, _, _), result in zip(tasks, results):
        if isinstance(result, Exhausted):
            result = result.cause
        if isinstance(result, BaseException):
            raise StorageTransferError(
                f"{verb} checkpoint {label} at {url} failed after {tries} attempt(s): "
                f"{name}: {type(result).__name__}: {_first_line(result)}"
            ) from result
