"""Faults against a real S3 server (moto): processes killed mid-upload, a
server answering 503, a server gone. Checkpoints are never seen half-made,
and errors are bounded and one line."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import random
import signal
import time

import pytest

from determined_launch.core._context import _single_process
from determined_launch.core._rundir import RunDir
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.storage import (
    METADATA_FILE,
    StorageTransferError,
    open_storage,
    parse_storage,
)
from tests import _storage_kill_worker as worker
from tests.storage_servers import FaultProxy, S3Server

KILLS = 20


def test_sigkill_at_20_moments_never_exposes_a_partial_checkpoint(
    s3_server: S3Server, tmp_path: pathlib.Path
) -> None:
    block = s3_server.block(s3_server.new_bucket())
    run = tmp_path / "run"
    backend = open_storage(parse_storage(block, where="test"))
    mp = multiprocessing.get_context("forkserver")
    mp.set_forkserver_preload(["tests._storage_kill_worker", "s3fs", "fsspec"])
    rng = random.Random(1234)
    resumed_from: list[int] = []
    verified: set[str] = set()
    steps: dict[str, int] = {}
    for _ in range(KILLS):
        ctx = CheckpointContext(_single_process(), backend, RunDir(run, trial_id=None))
        committed, _leftovers = backend.list_ids()
        latest = ctx.latest()
        # Committed checkpoints never change, so they are checked while the next
        # worker starts (its botocore start-up takes ~1 s): same checks, less wall time.
        ready = mp.Event()
        proc = mp.Process(target=worker.train_forever, args=(block, str(run), ready))
        proc.start()
        try:
            for sid in committed:  # metadata never changes once committed: read each once
                if sid not in steps:
                    steps[sid] = backend.get_metadata(sid)["steps_completed"]
            assert set(steps) == set(committed)  # nothing committed ever disappears
            # The next run resumes from the newest committed checkpoint, exactly.
            assert latest == (max(steps, key=lambda s: steps[s]) if steps else None)
            resumed_from.append(steps.get(latest, 0) if latest else 0)
            for sid, step in steps.items():  # every visible checkpoint is whole
                if sid in verified:
                    continue
                verified.add(sid)
                with backend.restore_path(sid, None) as path:
                    assert sorted(os.listdir(path)) == [METADATA_FILE, "shard-0", "shard-1"]
                    for rank in (0, 1):
                        assert (path / f"shard-{rank}").read_bytes() == worker.shard_content(
                            step, rank)
            assert ready.wait(60), "worker did not start"
            time.sleep(rng.uniform(0.0, 0.6))
            assert proc.pid is not None and proc.is_alive(), f"worker died: {proc.exitcode}"
        finally:
            if proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
    assert resumed_from == sorted(resumed_from) and resumed_from[-1] > 0  # progress was kept
    committed, leftovers = backend.list_ids()
    assert committed and set(committed).isdisjoint(leftovers)
    print(f"kill test: {len(committed)} committed, {len(leftovers)} leftovers, "
          f"resumed from steps {resumed_from}")


def test_503_for_a_while_is_retried(s3_server: S3Server, fault_proxy: FaultProxy,
                                    tmp_path: pathlib.Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_STORAGE_RETRIES", "4")
    block = s3_server.block(s3_server.new_bucket(), endpoint=fault_proxy.endpoint)
    ctx = CheckpointContext(_single_process(), open_storage(parse_storage(block, where="t")),
                            RunDir(tmp_path / "run", trial_id=None))
    fault_proxy.fail_for(4)
    with ctx.store_path({"steps_completed": 1}) as (path, sid):
        (path / "a").write_bytes(b"a" * 1000)
    assert fault_proxy.failed == 4
    assert ctx.latest() == sid and ctx.get_metadata(sid) == {"steps_completed": 1}


def test_503_forever_fails_in_bounded_time_naming_id_and_url(
    s3_server: S3Server, fault_proxy: FaultProxy, tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DET_STORAGE_RETRIES", "2")
    bucket = s3_server.new_bucket()
    block = s3_server.block(bucket, endpoint=fault_proxy.endpoint)
    backend = open_storage(parse_storage(block, where="t"))
    ctx = CheckpointContext(_single_process(), backend, RunDir(tmp_path / "run", trial_id=None))
    fault_proxy.fail_for(-1)
    start = time.monotonic()
    try:
        with pytest.raises(StorageTransferError) as e:
            with ctx.store_path({"steps_completed": 1}) as (path, sid):
                (path / "a").write_bytes(b"a")
    finally:
        fault_proxy.fail_for(0)
    assert time.monotonic() - start < 30
    message = str(e.value)
    assert f"checkpoint {sid}" in message and f"s3://{bucket}/exp" in message
    assert "\n" not in message
    assert ctx.latest() is None and backend.list_ids()[0] == []


def test_server_gone_and_bad_credentials_are_one_line(
    s3_server: S3Server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import free_port_block

    monkeypatch.setenv("DET_STORAGE_RETRIES", "2")
    dead = f"http://127.0.0.1:{free_port_block(1)}"
    bucket = s3_server.new_bucket()
    start = time.monotonic()
    with pytest.raises(Exception, match="cannot reach storage") as e:
        open_storage(parse_storage(s3_server.block(bucket, endpoint=dead), where="t"),
                     probe=True)
    assert time.monotonic() - start < 30 and "\n" not in str(e.value)
    with pytest.raises(Exception, match="checkpoint_storage.bucket 'no-such' does not exist"):
        open_storage(parse_storage(s3_server.block("no-such"), where="t"), probe=True)


def test_a_directory_checkpoint_is_on_disk_before_it_is_committed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine that loses power after the commit's rename must not come back with a
    committed checkpoint whose files the page cache never wrote: every file and the
    directories naming them are fsynced while metadata.json does not exist yet."""
    root = tmp_path / "ckpts"
    backend = open_storage(parse_storage(str(root), where="test"))
    ctx = CheckpointContext(_single_process(), backend, RunDir(tmp_path / "run", trial_id=None))
    synced: list[tuple[str, bool]] = []  # (what, whether any metadata.json existed then)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"),
                       any(root.glob(f"*/{METADATA_FILE}"))))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with ctx.store_path({"steps_completed": 1}) as (path, sid):
        (path / "sub").mkdir()
        (path / "model.bin").write_bytes(b"w" * 1000)
        (path / "sub" / "opt.bin").write_bytes(b"o" * 1000)
    def inside(what: str) -> str:  # .partial-<id>/sub/opt.bin -> sub/opt.bin
        return "/".join(pathlib.Path(what).relative_to(root).parts[1:]) or "."

    before = {inside(w) for w, committed in synced if not committed and w.startswith(f"{root}/")}
    assert {"model.bin", "sub/opt.bin", "sub"} <= before, synced
    assert (root / sid / "sub" / "opt.bin").read_bytes() == b"o" * 1000
