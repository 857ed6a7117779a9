"""Large files to S3 (moto's server): a sliding window of parts, each part
retried on its own, and the checkpoint whole once committed."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

import pytest

from determined_launch.core._context import _single_process
from determined_launch.core._rundir import RunDir
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.storage import (
    multipart,
    objectstore,
    open_storage,
    parse_storage,
    transfer,
)
from determined_launch.core.storage.multipart import MAX_PARTS, part_size
from tests.storage_servers import FaultProxy, S3Server

MIB = 1 << 20


def _checkpoint(block: dict[str, Any], tmp_path: pathlib.Path) -> tuple[Any, CheckpointContext]:
    backend = open_storage(parse_storage(block, where="test"))
    return backend, CheckpointContext(_single_process(), backend,
                                      RunDir(tmp_path / "run", trial_id=None))


def _spy(fs: Any, before: Any) -> list[tuple[str, int, float, float]]:
    """Hooks into the real S3 client that sends the parts (botocore's events):
    records (operation, part, start, end) of every call; ``before(operation, part)``
    runs first."""
    client = multipart.sync_client(fs, objectstore.S3_PARTS_IN_FLIGHT)
    assert client is not None
    calls: list[tuple[str, int, float, float]] = []

    def on_call(model: Any, params: Any, context: Any, **_: Any) -> None:
        part = int(params.get("PartNumber") or 0)
        context["spy"] = (part, time.monotonic())
        before(model.name, part)

    def on_done(model: Any, context: Any, **_: Any) -> None:
        part, start = context["spy"]
        calls.append((model.name, part, start, time.monotonic()))

    client.meta.events.register("before-parameter-build.s3", on_call)
    client.meta.events.register("after-call.s3", on_done)
    client.meta.events.register("after-call-error.s3", on_done)
    return calls


def test_parts_slide_through_a_bounded_window(
    s3_server: S3Server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(objectstore, "S3_PARTS_IN_FLIGHT", 2)
    bucket = s3_server.new_bucket()
    backend, ctx = _checkpoint(s3_server.block(bucket), tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(25 * MIB)  # 4 parts of 8 MiB (the last 1 MiB)
    (src / "model.pt").write_bytes(data)
    (src / "small").write_bytes(b"s" * 100)

    def before(method: str, part: int) -> None:
        if method == "UploadPart" and part == 1:
            time.sleep(1.5)  # a slow part must not hold up the others

    calls = _spy(backend.fs, before)
    sid = ctx.upload(src, {"steps_completed": 1})
    parts = {p: (start, end) for m, p, start, end in calls if m == "UploadPart"}
    assert sorted(parts) == [1, 2, 3, 4]
    most = max(sum(s <= t < e for s, e in parts.values()) for t, _ in parts.values())
    assert most == 2  # never more than the window in flight
    assert parts[3][0] < parts[1][1]  # slid past part 1 (batches of 2 would wait for it)
    # The object keeps a checksum of its parts' CRC32s, as boto3's uploads do.
    head = s3_server.client().head_object(Bucket=bucket, Key=f"exp/{sid}/model.pt",
                                          ChecksumMode="ENABLED")
    assert head["ContentLength"] == len(data) and head.get("ChecksumCRC32")
    dst = tmp_path / "dst"
    ctx.download(sid, dst)
    assert (dst / "model.pt").read_bytes() == data and (dst / "small").read_bytes() == b"s" * 100


def test_a_failing_part_is_retried_alone(
    s3_server: S3Server, fault_proxy: FaultProxy, tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(objectstore, "S3_PARTS_IN_FLIGHT", 1)  # the 503s hit part 2 only
    monkeypatch.setattr(transfer, "_BACKOFF_BASE", 0.01)
    monkeypatch.setenv("DET_STORAGE_RETRIES", "3")
    block = s3_server.block(s3_server.new_bucket(), endpoint=fault_proxy.endpoint)
    backend, ctx = _checkpoint(block, tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(17 * MIB)
    (src / "model.pt").write_bytes(data)
    failed: list[int] = []

    def before(method: str, part: int) -> None:
        if method == "UploadPart" and part == 2 and not failed:
            failed.append(part)
            fault_proxy.fail_for(-1)  # every HTTP attempt of this client call (botocore's retries)

    def after_call(**_: Any) -> None:  # the call has failed: heal
        fault_proxy.fail_for(0)

    calls = _spy(backend.fs, before)
    client = multipart.sync_client(backend.fs, 1)
    assert client is not None
    client.meta.events.register("after-call.s3.UploadPart", after_call)
    try:
        sid = ctx.upload(src, {"steps_completed": 1})
    finally:
        fault_proxy.fail_for(0)
    ops = [(m, p) for m, p, _, _ in calls]
    # The file was not restarted: one multipart upload, part 1 sent once, part 2 twice.
    assert ops.count(("CreateMultipartUpload", 0)) == 1
    assert ops.count(("UploadPart", 1)) == 1 and ops.count(("UploadPart", 2)) == 2
    with backend.restore_path(sid, None) as path:
        assert (path / "model.pt").read_bytes() == data


def test_part_size_keeps_within_the_part_limit() -> None:
    assert part_size(1 << 30, 8 * MIB) == 8 * MIB
    big = 200 << 30  # 200 GiB: 8 MiB parts would be 25,600
    size = part_size(big, 8 * MIB)
    assert size % MIB == 0 and -(-big // size) <= MAX_PARTS < -(-big // (size - MIB))


def test_a_filesystem_with_its_own_session_keeps_s3fs_put() -> None:
    s3fs = pytest.importorskip("s3fs")
    from aiobotocore.session import AioSession

    own = s3fs.S3FileSystem(session=AioSession(), skip_instance_cache=True,
                            endpoint_url="http://127.0.0.1:9")
    assert multipart.sync_client(own, 10) is None  # large files then go through s3fs's put
    plain = s3fs.S3FileSystem(key="k", secret="s", endpoint_url="http://127.0.0.1:9",
                              skip_instance_cache=True)
    client: Any = multipart.sync_client(plain, 10)
    again = multipart.sync_client(plain, 10)
    assert again is not None and again is client  # made once per filesystem
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    assert client.meta.config.max_pool_connections >= 10
