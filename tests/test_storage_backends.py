"""The whole Core checkpoint surface on every backend, against real servers.

Backends: a directory (rename commit), S3 on moto, Azure on azurite, and
gs:// through the shared fsspec path on fsspec's memory filesystem (no GCS
emulator installs here). Sharded cases run ranks as threads
(tests/_core_helpers.ThreadGroup); the multi-process kill test is in
tests/test_storage_faults.py.
"""

from __future__ import annotations

import os
import pathlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from determined_launch.core import DownloadMode
from determined_launch.core._context import _single_process
from determined_launch.core._rundir import RunDir
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.storage import (
    METADATA_FILE,
    StorageBackend,
    StorageConfigError,
    StorageSpec,
    open_storage,
    parse_storage,
)
from tests._core_helpers import run_ranks
from tests.storage_servers import Azurite, S3Server

Factory = Callable[[], StorageBackend]


class _LockedMemoryFS(MemoryFileSystem):  # type: ignore[misc]
    """fsspec's memory filesystem with its reads and writes serialized: its
    files are shared in-process objects with one read position (open('rb')
    returns the stored object itself), so ranks running as threads would see
    each other's position. Real stores have no such limit."""

    _lock = threading.RLock()

    def get_file(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return super().get_file(*args, **kwargs)

    def put_file(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return super().put_file(*args, **kwargs)

    def cat_file(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return super().cat_file(*args, **kwargs)


def memory_fs() -> Any:
    return _LockedMemoryFS(skip_instance_cache=True)


@pytest.fixture(params=["dir", "s3", "azure", "gs-memory"])
def make_backend(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Factory:
    kind = request.param
    if kind == "dir":
        spec = parse_storage(str(tmp_path / "ckpts"), where="test")
        return lambda: open_storage(spec)
    if kind == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        spec = parse_storage(s3.block(s3.new_bucket()), where="test")
        return lambda: open_storage(spec, probe=True)
    if kind == "azure":
        az: Azurite = request.getfixturevalue("azurite")
        spec = parse_storage({"type": "azure", "container": az.new_container(), "prefix": "exp",
                              "connection_string": az.connection_string}, where="test")
        return lambda: open_storage(spec, probe=True)
    spec = StorageSpec("gs", f"bucket-{uuid.uuid4().hex[:8]}/exp")
    return lambda: open_storage(spec, fs=memory_fs())


def context(backend: StorageBackend, run: pathlib.Path, dist: Any = None) -> CheckpointContext:
    return CheckpointContext(dist or _single_process(), backend, RunDir(run, trial_id=None))


def tree(root: pathlib.Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_whole_surface(make_backend: Factory, tmp_path: pathlib.Path) -> None:
    backend = make_backend()
    ctx = context(backend, tmp_path / "run")
    assert ctx.latest() is None
    with ctx.store_path({"steps_completed": 3}) as (path, sid):
        (path / "model.bin").write_bytes(b"m" * 70_000)
        (path / "opt").mkdir()
        (path / "opt" / "state.txt").write_text("s")
        (path / METADATA_FILE).write_text("{}")  # ours to write: replaced by the marker
    assert ctx.latest() == sid and ctx.committed_ids() == [sid]
    assert ctx.get_metadata(sid) == {"steps_completed": 3}
    with ctx.restore_path(sid) as restored:
        files = tree(restored)
    assert sorted(files) == [METADATA_FILE, "model.bin", "opt/state.txt"]
    assert files["model.bin"] == b"m" * 70_000

    for mode in DownloadMode:
        dst = tmp_path / f"dl-{mode.name}"
        ctx.download(sid, dst, mode, selector=lambda rel: rel.startswith("opt/"))
        assert tree(dst) == {"opt/state.txt": b"s"}

    src = tmp_path / "src"
    (src / "skip").mkdir(parents=True)
    (src / "keep.txt").write_text("k")
    (src / "skip" / "no.txt").write_text("n")
    second = ctx.upload(src, {"steps_completed": 4}, selector=lambda rel: rel == "keep.txt")
    assert ctx.latest() == second and sorted(ctx.committed_ids()) == sorted([sid, second])
    with ctx.restore_path(second, DownloadMode.NoSharedDownload) as restored:
        assert tree(restored) == {"keep.txt": b"k", METADATA_FILE: tree(restored)[METADATA_FILE]}

    ctx.delete(sid, globs=["opt/*"])
    with ctx.restore_path(sid) as restored:
        assert sorted(tree(restored)) == [METADATA_FILE, "model.bin"]
    ctx.delete(second)
    assert ctx.latest() is None and ctx.committed_ids() == [sid]
    with pytest.raises(FileNotFoundError, match=f"checkpoint {second} not found"):
        ctx.get_metadata(second)
    with pytest.raises(ValueError, match="invalid checkpoint storage id"):
        ctx.get_metadata("../x")
    assert backend.list_ids() == ([sid], [])


def test_failed_block_commits_nothing(make_backend: Factory, tmp_path: pathlib.Path) -> None:
    backend = make_backend()
    ctx = context(backend, tmp_path / "run")
    with pytest.raises(OSError, match="disk full"):
        with ctx.store_path({"steps_completed": 1}) as (path, _):
            (path / "half").write_text("x")
            raise OSError("disk full")
    assert backend.list_ids() == ([], []) and ctx.latest() is None


def test_uncommitted_files_are_invisible_and_gc_removes_them(
    make_backend: Factory, tmp_path: pathlib.Path
) -> None:
    """A crash after the files, before the marker: never listed or restored."""
    backend = make_backend()
    ctx = context(backend, tmp_path / "run")
    with ctx.store_path({"steps_completed": 1}) as (path, good):
        (path / "a").write_text("1")
    crashed = str(uuid.uuid4())
    staging = backend.begin(crashed)
    (staging / "a").write_text("2")
    backend.put(crashed, staging, {"a": 1})  # uploaded, never committed
    backend.release(crashed, staging)
    assert backend.list_ids() == ([good], [crashed])
    assert not backend.is_committed(crashed) and ctx.latest() == good
    with pytest.raises(FileNotFoundError):
        with ctx.restore_path(crashed):
            pass
    backend.remove_leftover(crashed)
    assert backend.list_ids() == ([good], [])


def test_sharded_store_and_upload(make_backend: Factory, tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> tuple[str, str, dict[str, bytes], dict[str, Any]]:
        ctx = context(make_backend(), tmp_path / f"run{dist.rank}", dist)
        with ctx.store_path({"steps_completed": 5, f"r{dist.rank}": 1}, shard=True) as (p, sid):
            (p / f"shard-{dist.rank}").write_text(str(dist.rank))
        own = tmp_path / f"up{dist.rank}"
        own.mkdir()
        (own / f"part-{dist.rank}").write_text("p")
        up = ctx.upload(own if dist.rank != 1 else None, {"kind": "upload"}, shard=True)
        with ctx.restore_path(sid) as restored:  # LocalWorkersShareDownload, in step
            files = tree(restored)
        return sid, up, files, ctx.get_metadata(up)

    out = run_ranks(3, rank_main)
    assert len({o[0] for o in out}) == 1 and len({o[1] for o in out}) == 1
    for _, _, files, md in out:
        assert {k: v for k, v in files.items() if k != METADATA_FILE} == {
            "shard-0": b"0", "shard-1": b"1", "shard-2": b"2"}
        assert md == {"kind": "upload"}
    backend = make_backend()
    with backend.restore_path(out[0][1], None) as restored:
        assert sorted(tree(restored)) == [METADATA_FILE, "part-0", "part-2"]


def test_sharded_conflicts_commit_nothing(make_backend: Factory, tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> list[str]:
        ctx = context(make_backend(), tmp_path / f"run{dist.rank}", dist)
        errors = []
        src = tmp_path / f"src{dist.rank}"
        src.mkdir()
        (src / "same.pt").write_text(str(dist.rank))
        try:
            ctx.upload(src, {}, shard=True)
        except RuntimeError as e:
            errors.append(str(e))
        try:
            with ctx.store_path({"steps_completed": dist.rank}, shard=True):
                pass
        except RuntimeError as e:
            errors.append(str(e))
        return errors

    for errors in run_ranks(2, rank_main):
        assert len(errors) == 2
        assert "file same.pt was written by ranks [0, 1]" in errors[0]
        assert "conflict at steps_completed" in errors[1]
    assert make_backend().list_ids()[0] == []


def test_non_chief_upload_names_upload(tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> str:
        if dist.rank == 0:
            return ""
        ctx = context(open_storage(parse_storage(str(tmp_path / "c"), where="t")),
                      tmp_path / "run", dist)
        with pytest.raises(RuntimeError) as e:
            ctx.upload(tmp_path, {})
        return str(e.value)

    message = run_ranks(2, rank_main)[1]
    assert "checkpoint.upload(shard=False) may only be called on the chief" in message
    assert "store_path" not in message


def test_azure_wrong_credentials_are_one_line(azurite: Azurite) -> None:
    from tests.storage_servers import AZURITE_KEY

    container = azurite.new_container()
    wrong = azurite.connection_string.replace(AZURITE_KEY, "A" * 86 + "==")
    for conn, message in [(wrong, "access denied"),
                          ("garbage", "cannot set up the storage client")]:
        block = {"type": "azure", "container": container, "connection_string": conn}
        with pytest.raises(StorageConfigError) as e:
            open_storage(parse_storage(block, where="t"), probe=True)
        assert message in str(e.value) and "\n" not in str(e.value)
        assert AZURITE_KEY not in str(e.value) and conn not in str(e.value)


def test_local_workers_share_one_download(tmp_path: pathlib.Path) -> None:
    """Two ranks on one node: one download, the same directory for both,
    kept until both have left the block."""
    spec = StorageSpec("gs", f"bucket-{uuid.uuid4().hex[:8]}/exp")
    seed = context(open_storage(spec, fs=memory_fs()), tmp_path / "seed")
    with seed.store_path({"steps_completed": 1}) as (path, sid):
        (path / "w").write_text("weights")

    def rank_main(dist: Any) -> tuple[str, str, list[str]]:
        dist.cross_rank = 0  # one node
        ctx = context(open_storage(spec, fs=memory_fs()),
                      tmp_path / f"run{dist.rank}", dist)
        with ctx.restore_path(sid) as path:
            if dist.rank == 0:
                pass  # leaves at once; rank 1 must still find the files
            else:
                import time

                time.sleep(0.3)
            content = (path / "w").read_text()
        dst = tmp_path / "shared-dl"
        ctx.download(sid, dst)
        return str(path), content, sorted(os.listdir(dst))

    out = run_ranks(2, rank_main)
    assert out[0][0] == out[1][0] and out[0][1] == out[1][1] == "weights"
    assert not pathlib.Path(out[0][0]).exists()  # removed after both left
    assert out[0][2] == out[1][2] == [METADATA_FILE, "w"]
