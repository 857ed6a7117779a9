"""S3 multipart upload of large files: a sliding window of parts on threads.

s3fs's ``put_file`` sends the parts of a file in lock-step batches of ten
and waits for the slowest of each batch; and on its single event-loop
thread, every part's hashing (the CRC32 checksum, and over plain HTTP the
signed SHA-256) and sending queue behind each other. boto3's transfer
manager keeps ten parts in flight on ten threads, which made it 1.35x
faster for a 1 GB file. Here the parts of every large file of one upload go
through one pool of ``window`` threads, each with botocore's own (thread-safe)
client, built from the s3fs filesystem's settings (credentials, endpoint,
profile, timeouts, retries). A part that finishes lets the next start at
once, and a part is read from disk only when its thread takes it, so an
upload holds at most ``window`` parts in memory however many large files it
sends. Small files, listing and everything else stay on s3fs.

Each part is retried on its own (``transfer.with_retries``); a part that
exhausts its retries aborts the multipart upload and fails the file without
retrying the whole file again (``transfer.Exhausted``). Integrity: botocore
sends each part with its CRC32 (and over plain HTTP its signed SHA-256),
which the server checks; the upload declares CRC32 and completes with every
part's checksum, as boto3 does, so the object keeps a checksum of its parts;
the commit then checks every object's size before writing the marker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import math
import os
import threading
from collections.abc import Callable
from typing import Any, Optional, TypeVar

from determined_launch.core.storage import transfer

#: S3 allows at most 10,000 parts per upload; larger files get larger parts.
MAX_PARTS = 10_000
_T = TypeVar("_T")
_CLIENT_ATTR = "_det_launch_sync_client"
logger = logging.getLogger("determined_launch.core")
_client_lock = threading.Lock()


def part_size(size: int, preferred: int) -> int:
    """``preferred``, or the smallest size (a whole MiB) that fits ``size`` in MAX_PARTS."""
    needed = math.ceil(size / MAX_PARTS)
    return max(preferred, math.ceil(needed / (1 << 20)) << 20)


def sync_client(fs: Any, connections: int) -> Optional[Any]:
    """botocore's S3 client with the settings s3fs ``fs`` builds its own from
    (``S3FileSystem.set_session``), made once per filesystem; ``None`` when
    ``fs`` was given a session of its own, which a sync client cannot share."""
    with _client_lock:
        cached = getattr(fs, _CLIENT_ATTR, None)
        if cached is not None:
            return cached
        if fs.session is not None and not getattr(fs, "_session_is_owned", False):
            return None  # (or an s3fs too old to say whose session it is)
        try:
            client = _build_client(fs, connections)
        except Exception as e:  # an s3fs we do not know: its own put_file still works
            logger.debug("large files go through s3fs's put_file: %s", e)
            return None
        setattr(fs, _CLIENT_ATTR, client)
        return client


def _build_client(fs: Any, connections: int) -> Any:
    import botocore.session
    from botocore.config import Config

    options = {k: v for k, v in fs._prepare_config_kwargs().items()
               if k in Config.OPTION_DEFAULTS}  # aiobotocore-only keys dropped
    options["max_pool_connections"] = max(connections,
                                          int(options.get("max_pool_connections") or 0))
    client_kwargs = dict(fs.client_kwargs)
    init = {"aws_access_key_id": fs.key, "aws_secret_access_key": fs.secret,
            "aws_session_token": fs.token, "endpoint_url": fs.endpoint_url}
    init = {k: v for k, v in init.items() if v is not None and k not in client_kwargs}
    if "use_ssl" not in client_kwargs:
        init["use_ssl"] = fs.use_ssl
    if fs.anon:
        from botocore import UNSIGNED

        for key in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"):
            init.pop(key, None)
            client_kwargs.pop(key, None)
        options["signature_version"] = UNSIGNED
    session = botocore.session.Session(**fs.kwargs)
    return session.create_client("s3", config=Config(**options), **init, **client_kwargs)


class Window:
    """The parts in flight of one upload: ``size`` threads, made on first use
    and shared by all its large files."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.size, "det-s3-part")
            return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


async def put_file(fs: Any, client: Any, lpath: str, rpath: str, *, size: int, part: int,
                   window: Window, what: str) -> None:
    """Upload ``lpath`` (``size`` bytes) to ``rpath`` (s3fs ``fs``'s path form)
    in parts of ``part`` bytes through ``client``. Raises ``transfer.Exhausted``
    once a part failed after its retries (the upload is then aborted)."""
    bucket, key, _ = fs.split_path(rpath)
    loop = asyncio.get_running_loop()
    pool = window.pool()

    def run(fn: Callable[[], _T]) -> asyncio.Future[_T]:
        return loop.run_in_executor(pool, _translated, fn)

    # As boto3's transfer manager: the upload declares CRC32, so the server keeps a
    # checksum of the whole object from the parts' (and moto works a third less).
    checksum = ({"ChecksumAlgorithm": "CRC32"} if getattr(
        client.meta.config, "request_checksum_calculation", None) != "when_required" else {})
    upload_id = (await run(lambda: client.create_multipart_upload(
        Bucket=bucket, Key=key, **checksum)))["UploadId"]
    count = math.ceil(size / part)
    fd = os.open(lpath, os.O_RDONLY)

    def send(index: int) -> dict[str, Any]:
        offset = index * part
        length = min(part, size - offset)
        body = os.pread(fd, length, offset)  # read only now: at most `window` parts in memory
        if len(body) != length:
            raise transfer.Exhausted(OSError(
                f"{lpath} is shorter than {size} bytes: it changed while uploading"))
        reply: list[dict[str, Any]] = []
        _retried(lambda: reply.append(client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=index + 1,
            Body=body, **checksum)), f"{what} part {index + 1}/{count}")
        done = {"PartNumber": index + 1, "ETag": reply[0]["ETag"]}
        if "ChecksumCRC32" in reply[0]:
            done["ChecksumCRC32"] = reply[0]["ChecksumCRC32"]
        return done

    futures = [run(functools.partial(send, i)) for i in range(count)]
    try:
        parts = list(await asyncio.gather(*futures))
        await run(lambda: _retried(lambda: client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}),
            f"{what} (completing)"))
    except BaseException:
        for future in futures:
            future.cancel()
        await asyncio.gather(*futures, return_exceptions=True)
        with contextlib.suppress(Exception):  # best effort: lifecycle rules clean up the rest
            await run(lambda: client.abort_multipart_upload(Bucket=bucket, Key=key,
                                                           UploadId=upload_id))
        raise
    finally:
        os.close(fd)


def _translated(fn: Callable[[], _T]) -> _T:
    """botocore's errors as s3fs raises them (PermissionError for refused
    credentials, so they are not retried)."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    try:
        return fn()
    except ClientError as e:
        raise translate_boto_error(e) from e


def _retried(fn: Callable[[], object], what: str) -> None:
    try:
        transfer.with_retries(lambda: _translated(fn), what)
    except Exception as e:  # retried here already: the file as a whole is not
        raise transfer.Exhausted(e) from e
