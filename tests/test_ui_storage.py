"""Runs whose files are in object storage: the chief syncs its records there
(core/_record_sync.py) and ``det-launch ui s3://...`` reads them back, against
moto's real S3 server (tests/storage_servers.py)."""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import pytest

from determined_launch.core._record_sync import RecordSync, storage_run_name
from determined_launch.core._rundir import RunDir
from tests._ui_helpers import Served
from tests.conftest import base_env

RUN = """
from determined_launch import core
with core.init() as ctx:
    for step in (1, 2, 3):
        ctx.train.report_training_metrics(step, {"loss": 1.0 / step})
    ctx.train.report_validation_metrics(3, {"accuracy": 0.75})
    with ctx.checkpoint.store_path({"steps_completed": 3}) as (path, uuid):
        (path / "weights").write_text("w")
    print("UUID", uuid)
"""


def _s3_env(s3: Any) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def test_run_names_in_storage() -> None:
    assert storage_run_name(pathlib.Path("/x/det_runs/my-run")) == "my-run"
    assert storage_run_name(pathlib.Path("/x/det_experiments/exp/trials/3")) == "exp.trial-3"


def test_sync_failures_are_one_warning_and_never_stop_training(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    tried = []

    def upload(name: str, local: pathlib.Path) -> None:
        tried.append(name)
        raise OSError("storage down")

    sync = RecordSync(tmp_path, upload)
    run = RunDir(tmp_path, trial_id=None)
    run.on_write = sync.poke
    with caplog.at_level(logging.WARNING, logger="determined_launch.core"):
        for step in range(20):
            run.append("training", {"steps_completed": step, "metrics": {"loss": 1.0}})
        sync.close()
        run.write_pointer("early_exit", {"reason": "INVALID_HP"})  # after close: at once
    warned = [r for r in caplog.records if "records to storage failed" in r.getMessage()]
    assert len(warned) == 1 and "storage down" in warned[0].getMessage()
    assert "early_exit.json" in tried and len(tried) < 20  # at most one sync a second


def test_an_early_exit_after_the_context_closed_is_synced(tmp_path: pathlib.Path) -> None:
    import fsspec

    from determined_launch import InvalidHP, core

    url = f"memory://rec-{tmp_path.name}/exp"
    with pytest.raises(SystemExit) as exit_:
        with core.init(run_dir=str(tmp_path / "run-x"), checkpoint_storage=url) as ctx:
            ctx.train.report_training_metrics(1, {"loss": 0.5})
            raise InvalidHP("lr too big")
    assert exit_.value.code == 0
    fs = fsspec.filesystem("memory")
    prefix = f"/rec-{tmp_path.name}/exp/runs/run-x"
    assert "INVALID_HP" in json.loads(fs.cat_file(f"{prefix}/early_exit.json"))["reason"]
    assert fs.cat_file(f"{prefix}/training.jsonl") == \
        (tmp_path / "run-x" / "training.jsonl").read_bytes()


def test_a_run_in_s3_is_served_from_s3(tmp_path: pathlib.Path, s3_server: Any,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = s3_server.new_bucket()
    storage = f"s3://{bucket}/prefix"
    run_dir = tmp_path / "det_runs" / "my-run"
    r = subprocess.run([sys.executable, "-c", RUN], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60, env=base_env(DET_CHECKPOINT_STORAGE=storage,
                                                DET_RUN_DIR=str(run_dir), **_s3_env(s3_server)))
    assert r.returncode == 0, r.stderr
    uuid = r.stdout.split("UUID ")[1].split()[0]
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(
        Bucket=bucket, Prefix="prefix/runs/")["Contents"]}
    assert {"prefix/runs/my-run/training.jsonl", "prefix/runs/my-run/validation.jsonl",
            "prefix/runs/my-run/checkpoints.jsonl",
            "prefix/runs/my-run/latest_checkpoint.json"} <= keys, keys
    shutil.rmtree(run_dir)  # what follows reads the storage only

    for var, value in _s3_env(s3_server).items():
        monkeypatch.setenv(var, value)
    served = Served(storage)
    try:
        runs = served.json("/api/v1/runs")
        assert [r["name"] for r in runs] == ["my-run"] and runs[0]["steps_completed"] == 3
        training = served.json("/api/v1/runs/my-run/metrics?group=training")
        assert [(m["steps_completed"], m["metrics"]["loss"]) for m in training] == \
            [(1, 1.0), (2, 0.5), (3, 1 / 3)]
        validation = served.json("/api/v1/runs/my-run/metrics?group=validation")
        assert [m["metrics"] for m in validation] == [{"accuracy": 0.75}]
        checkpoints = served.json("/api/v1/runs/my-run/checkpoints")
        assert [(c["uuid"], c["steps_completed"]) for c in checkpoints] == [(uuid, 3)]
        page = json.dumps(served.json("/api/v1/runs/my-run"))
        assert "testing" not in page  # the credentials never reach a page
        mirrors = list(pathlib.Path(served.json("/api/v1/runs")[0]["path"]).parents)[2]
        assert mirrors.name.startswith("det-ui-") and mirrors.stat().st_mode & 0o077 == 0
    finally:
        served.stop()
    assert served.proc.returncode == 0 and not mirrors.exists()  # a stop removes the copy


def test_the_mirror_fetches_only_what_grew(tmp_path: pathlib.Path, s3_server: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_launch.ui.remote import Mirror

    for var, value in _s3_env(s3_server).items():
        monkeypatch.setenv(var, value)
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    # The chief's side: its records uploaded as the run goes.
    run_dir = tmp_path / "run-a"
    run_dir.mkdir()

    def upload(name: str, local: pathlib.Path) -> None:
        s3.upload_file(str(local), bucket, f"p/runs/run-a/{name}")

    mirror = Mirror(f"s3://{bucket}/p")
    try:
        mirror.first_sync()  # before the run: it appears at a later sync
        sync = RecordSync(run_dir, upload)
        (run_dir / "training.jsonl").write_text('{"steps_completed": 1, "metrics": {"x": 1}}\n')
        (run_dir / "cluster_info.json").write_text('{"job_secret": "s"}')  # never uploaded
        assert sync.sync() == ["training.jsonl"] and sync.sync() == []
        mirror.sync()
        local = mirror.local / "runs" / "run-a" / "training.jsonl"
        inode = local.stat().st_ino
        with open(run_dir / "training.jsonl", "a") as f:
            f.write('{"steps_completed": 2, "metrics": {"x": 2}}\n')
        assert sync.sync() == ["training.jsonl"]
        mirror.sync()
        assert local.read_text() == (run_dir / "training.jsonl").read_text()
        assert local.stat().st_ino == inode  # appended: readers parse only the new line
        # Another run of the same name replaced the stream: fetched whole.
        (run_dir / "training.jsonl").write_text('{"steps_completed": 7, "metrics": {"y": 1}}\n'
                                                * 3)
        sync.sync()
        mirror.sync()
        assert local.read_text() == (run_dir / "training.jsonl").read_text()
        assert not (mirror.local / "runs" / "run-a" / "cluster_info.json").exists()
    finally:
        mirror.close()
    assert not mirror.local.exists()
    one = Mirror(f"s3://{bucket}/p/runs/run-a")  # a PATH may be one run
    try:
        one.first_sync()
        assert (one.local / "training.jsonl").read_text() == \
            (run_dir / "training.jsonl").read_text() and one.local.name == "run-a"
    finally:
        one.close()


def test_object_storage_mistakes_are_one_line(tmp_path: pathlib.Path, s3_server: Any) -> None:
    def ui(path: str, no_s3fs: bool = False) -> subprocess.CompletedProcess[str]:
        code = (f"import sys\nif {no_s3fs!r}: sys.modules['s3fs'] = None\n"
                f"from determined_launch.cli import main\nsys.exit(main(['ui', {path!r}]))")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, env=base_env(**_s3_env(s3_server)))

    for r, needle in ((ui("s3://no-such-bucket-x/p"), "does not exist"),
                      (ui(f"s3://{s3_server.new_bucket()}/p", no_s3fs=True),
                       "pip install 'determined_launch[s3]'")):
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
        assert "testing" not in r.stderr and not r.stdout


def test_the_mirror_follows_and_an_outage_is_one_line(
        tmp_path: pathlib.Path, s3_server: Any, fault_proxy: Any,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import threading
    import time

    from determined_launch.ui import remote

    for var, value in {**_s3_env(s3_server), "AWS_ENDPOINT_URL": fault_proxy.endpoint}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(remote, "PERIOD", 0.05)
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    line = b'{"steps_completed": 1, "metrics": {"x": 1}}\n'
    s3.put_object(Bucket=bucket, Key="p/runs/r/training.jsonl", Body=line)
    mirror = remote.Mirror(f"s3://{bucket}/p")
    mirror.first_sync()
    local = mirror.local / "runs" / "r" / "training.jsonl"

    def until(check: Any) -> None:
        deadline = time.monotonic() + 15
        while not check():
            assert time.monotonic() < deadline
            time.sleep(0.05)

    failures = []
    sync = mirror.sync

    def counted() -> None:
        try:
            sync()
        except Exception as e:
            failures.append(e)
            raise

    monkeypatch.setattr(mirror, "sync", counted)
    threading.Thread(target=mirror.follow, daemon=True).start()
    try:
        s3.put_object(Bucket=bucket, Key="p/runs/r/training.jsonl", Body=line * 2)
        until(lambda: local.read_bytes() == line * 2)
        fault_proxy.fail_for(-1)  # the storage answers 503 from now on
        until(lambda: len(failures) >= 3)  # three periods failed
        fault_proxy.fail_for(0)
        s3.put_object(Bucket=bucket, Key="p/runs/r/training.jsonl", Body=line * 3)
        until(lambda: local.read_bytes() == line * 3)  # the copy was served meanwhile
    finally:
        fault_proxy.fail_for(0)
        mirror.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"PATH s3://{bucket}/p: " in err, err
