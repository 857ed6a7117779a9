"""Checkpoints in object storage (S3, GCS, Azure, fsspec memory) through fsspec.

Layout under the prefix: ``<prefix>/<storage_id>/<your files>`` and, once
committed, ``<prefix>/<storage_id>/metadata.json``.

Object stores cannot rename a directory, so the commit is a marker: each
rank uploads its files straight to the bucket, the chief then lists the
checkpoint and checks that every file every rank reported is there with its
size, and only then writes ``metadata.json``. Everything that reads
(listing, ``latest()``, restore, download, metadata) requires the marker, so
a crash at any moment leaves at worst objects without a marker, which
``det-launch checkpoints gc`` reports (and removes with ``--remove``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import pathlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from determined_launch.core._rundir import dumps
from determined_launch.core.storage import multipart, transfer
from determined_launch.core.storage.base import (
    METADATA_FILE,
    RESERVED_NAMES,
    Selector,
    check_storage_id,
    not_found,
)
from determined_launch.core.storage.spec import StorageConfigError, StorageSpec

#: S3: files up to this size go in one request, read whole (many files
#: already run in parallel); larger ones stream in parts of S3_UPLOAD_PART
#: (multipart.py), S3_PARTS_IN_FLIGHT at once across the whole upload, as
#: boto3's transfer manager does. So an upload holds at most about
#: DET_STORAGE_PARALLEL x 16 MiB + 80 MiB in memory.
S3_SINGLE_PUT_MAX = 16 << 20
S3_UPLOAD_PART = 8 << 20
S3_PARTS_IN_FLIGHT = 10


def make_filesystem(spec: StorageSpec) -> Any:
    """The fsspec filesystem for ``spec``; credentials come from ``spec.options``
    or the library's usual places (environment, config files, instance roles)."""
    import fsspec

    options: dict[str, Any] = dict(spec.options)
    if spec.protocol == "s3":
        # Our transfer layer retries with backoff; keep the library's own
        # retries short so the total stays bounded and a dead server fails fast.
        options.setdefault("use_listings_cache", False)
        options.setdefault("config_kwargs", {
            "retries": {"max_attempts": 2, "mode": "standard"},
            "connect_timeout": 10, "read_timeout": 60,
        })
    fs = fsspec.filesystem(spec.protocol, skip_instance_cache=True, **options)
    if spec.protocol == "s3":
        fs.retries = 2  # s3fs's own retry loop (a class attribute, not an argument)
    return fs


class ObjectStorage:
    shared_staging = False

    def __init__(self, spec: StorageSpec, fs: Any = None) -> None:
        self.spec = spec
        self.url = spec.url
        try:
            self.fs = fs if fs is not None else make_filesystem(spec)
        except (ValueError, TypeError, KeyError) as e:  # malformed options or credentials
            raise StorageConfigError(
                f"checkpoint storage {spec.url}: cannot set up the storage client "
                f"(check the checkpoint_storage block's credentials): {_line(e)}") from None
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        # An injected filesystem of another protocol (tests: gs:// on memory) takes the bare root.
        location = spec.url if spec.protocol in protocols else spec.root
        self.base = self.fs._strip_protocol(location).rstrip("/")
        self._staging: dict[str, pathlib.Path] = {}

    def _path(self, storage_id: str, rel: str = "") -> str:
        return f"{self.base}/{storage_id}" + (f"/{rel}" if rel else "")

    def _rel(self, storage_id: str, path: str) -> str:
        return path[len(self._path(storage_id)) + 1:]

    def _fresh(self) -> None:
        # Other ranks and processes write too: never answer from a listing cache.
        self.fs.invalidate_cache()

    # --- probing -------------------------------------------------------------

    def probe(self) -> None:
        """Fail early, in one line, on a wrong bucket or credentials."""
        bucket = self.base.strip("/").split("/")[0]
        field = "container" if self.spec.protocol == "az" else "bucket"
        if self.spec.protocol == "memory":
            return
        try:
            self._fresh()
            self.fs.ls(bucket, detail=False)
        except FileNotFoundError:
            raise StorageConfigError(
                f"checkpoint storage {self.url}: checkpoint_storage.{field} {bucket!r} "
                "does not exist") from None
        except Exception as e:
            if not _is_auth_error(e):
                raise StorageConfigError(
                    f"checkpoint storage {self.url}: cannot reach storage: "
                    f"{type(e).__name__}: {_line(e)}") from None
            raise StorageConfigError(
                f"checkpoint storage {self.url}: access denied ({_line(e)}); check the "
                "credentials (checkpoint_storage access_key/secret_key, connection_string, "
                "or the environment)") from None

    # --- writing -------------------------------------------------------------

    def staging_dir(self, storage_id: str) -> pathlib.Path:
        if storage_id not in self._staging:
            self._staging[storage_id] = pathlib.Path(
                tempfile.mkdtemp(prefix=f"det-ckpt-{storage_id[:8]}-"))
        return self._staging[storage_id]

    def begin(self, storage_id: str) -> pathlib.Path:
        return self.staging_dir(storage_id)

    def _transfer(self, tasks: list[tuple[str, int, Any]], verb: str, label: str) -> None:
        if getattr(self.fs, "async_impl", False):
            transfer.run_async(self.fs, tasks, verb=verb, label=label, url=self.url)
        else:
            transfer.run_parallel(tasks, verb=verb, label=label, url=self.url)

    def put(self, storage_id: str, src: pathlib.Path, files: Mapping[str, int]) -> None:
        # Async filesystems get coroutine factories (_put_file), others plain calls.
        is_async = getattr(self.fs, "async_impl", False)
        put = self.fs._put_file if is_async else self.fs.put_file
        window = multipart.Window(S3_PARTS_IN_FLIGHT)  # shared by all large files
        client = None
        if self.spec.protocol == "s3" and is_async and max(files.values(), default=0) > \
                S3_SINGLE_PUT_MAX:
            client = multipart.sync_client(self.fs, S3_PARTS_IN_FLIGHT)

        def task(rel: str, size: int) -> Any:
            local, remote = str(src / rel), self._path(storage_id, rel)
            if self.spec.protocol != "s3":
                return lambda: put(local, remote)
            if size > S3_SINGLE_PUT_MAX and client is not None:
                part = multipart.part_size(size, S3_UPLOAD_PART)
                return lambda: multipart.put_file(self.fs, client, local, remote, size=size,
                                                  part=part, window=window,
                                                  what=f"uploading {rel}")
            # s3fs sends one request below two chunks
            chunk = size + 1 if size <= S3_SINGLE_PUT_MAX else S3_UPLOAD_PART
            return lambda: put(local, remote, chunksize=chunk)

        try:
            self._transfer([(rel, size, task(rel, size)) for rel, size in sorted(files.items())],
                           "uploading", storage_id)
        finally:
            window.close()

    def _stored(self, storage_id: str) -> dict[str, int]:
        self._fresh()
        try:
            found = self.fs.find(self._path(storage_id), detail=True)
        except FileNotFoundError:
            return {}
        return {self._rel(storage_id, p): int(info.get("size") or 0)
                for p, info in found.items() if info.get("type") != "directory"}

    def commit(self, storage_id: str, metadata: Mapping[str, Any],
               files: Mapping[str, int]) -> None:
        stored = self._stored(storage_id)
        for rel, size in sorted(files.items()):
            if stored.get(rel) != size:
                raise RuntimeError(
                    f"checkpoint {storage_id} at {self.url} was not committed: {rel} is "
                    f"{'missing' if rel not in stored else f'{stored[rel]} bytes, not {size}'}")
        data = (dumps(dict(metadata)) + "\n").encode()
        marker = self._path(storage_id, METADATA_FILE)
        try:
            transfer.with_retries(lambda: self.fs.pipe_file(marker, data),
                                  f"writing {marker}")
        except Exception as e:
            raise transfer.StorageTransferError(
                f"committing checkpoint {storage_id} at {self.url} failed: "
                f"{type(e).__name__}: {_line(e)}") from e

    def abort(self, storage_id: str) -> None:
        with contextlib.suppress(Exception):
            if not self.is_committed(storage_id):  # never undo a commit
                self.fs.rm(self._path(storage_id), recursive=True)

    def release(self, storage_id: str, staging: pathlib.Path) -> None:
        self._staging.pop(storage_id, None)
        shutil.rmtree(staging, ignore_errors=True)

    # --- reading -------------------------------------------------------------

    def is_committed(self, storage_id: str) -> bool:
        try:
            check_storage_id(storage_id, self.url)
        except (FileNotFoundError, ValueError):
            return False
        self._fresh()
        return bool(self.fs.exists(self._path(storage_id, METADATA_FILE)))

    def _require(self, storage_id: str) -> None:
        check_storage_id(storage_id, self.url)
        if not self.is_committed(storage_id):
            raise not_found(storage_id, self.url)

    def list_ids(self) -> tuple[list[str], list[str]]:
        self._fresh()
        try:
            children = self.fs.ls(self.base, detail=True)
        except FileNotFoundError:
            return [], []
        names = (c["name"].rstrip("/").rsplit("/", 1)[-1] for c in children
                 if c.get("type") == "directory")
        ids = sorted(n for n in names if n not in RESERVED_NAMES)
        committed = {p.rstrip("/").split("/")[-2]
                     for p in self.fs.glob(f"{self.base}/*/{METADATA_FILE}")}
        return ([i for i in ids if i in committed], [i for i in ids if i not in committed])

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        check_storage_id(storage_id, self.url)
        try:
            raw = self.fs.cat_file(self._path(storage_id, METADATA_FILE))
        except FileNotFoundError:
            raise not_found(storage_id, self.url) from None
        data = json.loads(raw)
        return data if isinstance(data, dict) else {}

    def download(self, storage_id: str, dst: pathlib.Path, selector: Selector) -> None:
        self._require(storage_id)
        files = {rel: size for rel, size in self._stored(storage_id).items()
                 if selector is None or selector(rel)}
        dst.mkdir(parents=True, exist_ok=True)
        for rel in files:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        get = self.fs._get_file if getattr(self.fs, "async_impl", False) else self.fs.get_file

        def task(rel: str) -> Any:
            return lambda: get(self._path(storage_id, rel), str(dst / rel))

        self._transfer([(rel, size, task(rel)) for rel, size in sorted(files.items())],
                       "downloading", storage_id)

    @contextlib.contextmanager
    def restore_path(self, storage_id: str, selector: Selector) -> Iterator[pathlib.Path]:
        """Download into a private temporary directory, removed afterwards."""
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"det-restore-{storage_id[:8]}-"))
        try:
            self.download(storage_id, tmp, selector)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def delete(self, storage_id: str, globs: Optional[list[str]]) -> None:
        self._require(storage_id)
        if globs is None or "**/*" in globs:
            # The marker goes first: a crash mid-delete leaves a leftover, never
            # a damaged checkpoint that still looks committed.
            self.fs.rm_file(self._path(storage_id, METADATA_FILE))
            self.fs.rm(self._path(storage_id), recursive=True)
            return
        for rel in self._stored(storage_id):
            if rel != METADATA_FILE and any(fnmatch.fnmatch(rel, g) for g in globs):
                self.fs.rm_file(self._path(storage_id, rel))

    def remove_leftover(self, storage_id: str) -> None:
        check_storage_id(storage_id, self.url)
        if self.is_committed(storage_id):
            raise RuntimeError(f"checkpoint {storage_id} at {self.url} is committed; "
                               "not a leftover")
        self.fs.rm(self._path(storage_id), recursive=True)

    def put_extra(self, name: str, local: pathlib.Path) -> None:
        target = f"{self.base}/{name}"
        transfer.with_retries(lambda: self.fs.put_file(str(local), target), f"uploading {target}")


_AUTH_WORDS = ("authenticat", "accessdenied", "access denied", "forbidden", "signature",
               "invalidaccesskeyid", "credential")


def _is_auth_error(e: BaseException) -> bool:
    """Refused credentials, whatever the library calls them (PermissionError
    from s3fs, HttpResponseError 403 from Azure, ...)."""
    if isinstance(e, PermissionError) or getattr(e, "status_code", None) in (401, 403):
        return True
    text = f"{type(e).__name__} {e}".lower()
    return any(word in text for word in _AUTH_WORDS)


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
