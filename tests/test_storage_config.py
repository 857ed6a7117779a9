"""Storage forms and their one-line errors, retention, TensorBoard, and
``det-launch checkpoints`` (directory storage; object stores are in
tests/test_storage_backends.py)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from determined_launch import core
from determined_launch.cluster import ClusterInfo
from determined_launch.core.storage import Retention, StorageConfigError, parse_storage, retention
from tests.conftest import REPO, base_env
from tests.storage_servers import S3Server


def info(**extra: Any) -> ClusterInfo:
    return ClusterInfo(container_addrs=("127.0.0.1",), container_rank=0,
                       container_slot_counts=(1,), slot_ids=(0,), source="test", **extra)


def test_every_form(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_storage("ck", where="w").root == str(tmp_path / "ck")
    assert parse_storage(tmp_path / "p", where="w").root == str(tmp_path / "p")
    assert parse_storage("file:///data/ck", where="w").root == "/data/ck"
    s3 = parse_storage("s3://bucket/a/b/", where="w")
    assert (s3.protocol, s3.root, s3.url) == ("s3", "bucket/a/b", "s3://bucket/a/b")
    assert parse_storage("memory://m/x", where="w").protocol == "memory"
    block = parse_storage({"type": "s3", "bucket": "b", "prefix": "/p/", "access_key": "AK",
                           "secret_key": "SK", "endpoint_url": "http://e", "save_trial_best": 2},
                          where="w")
    assert block.url == "s3://b/p" and block.options == {
        "key": "AK", "secret": "SK", "endpoint_url": "http://e"}
    assert block.retention == Retention(save_trial_best=2)
    assert "SK" not in repr(block)
    shared = parse_storage({"type": "shared_fs", "host_path": "/mnt", "storage_path": "ck"},
                           where="w")
    assert shared.root == "/mnt/ck" and shared.is_directory and shared.retention is None
    az = parse_storage({"type": "azure", "container": "c", "connection_string": "x"}, where="w")
    assert az.url == "az://c" and az.options == {"connection_string": "x"}
    (tmp_path / "exp.yaml").write_text(
        "checkpoint_storage:\n  type: directory\n  container_path: /ck\n  save_trial_latest: 3\n")
    from_yaml = parse_storage("exp.yaml", where="w")
    assert from_yaml.root == "/ck" and from_yaml.retention == Retention(save_trial_latest=3)


@pytest.mark.parametrize("value, message", [
    ({"type": "hdfs"}, "w: checkpoint_storage.type: unknown type 'hdfs'"),
    ({"bucket": "b"}, "w: checkpoint_storage.type: unknown type None"),
    ({"type": "s3"}, "w: checkpoint_storage.bucket: missing"),
    ({"type": "s3", "bucket": 3}, "w: checkpoint_storage.bucket: expected a non-empty string"),
    ({"type": "s3", "bucket": "b", "buckt": 1}, "checkpoint_storage.buckt: unknown key"),
    ({"type": "s3", "bucket": "b", "access_key": "a"}, "checkpoint_storage.secret_key: "),
    ({"type": "shared_fs"}, "checkpoint_storage.host_path: missing"),
    ({"type": "gcs", "bucket": "b", "save_trial_best": -1}, "save_trial_best: expected an int"),
    ({"type": "azure", "connection_string": "x"}, "checkpoint_storage.container: missing"),
    ("ftp://x/y", "unsupported scheme 'ftp'"),
    ("s3://", "missing the bucket"),
    ("file://rel", "needs an absolute path"),
    ("no-such-exp.yaml", "w: no-such-exp.yaml: no such YAML file"),
    (["s3://b"], "expected a directory, a URL or a checkpoint_storage block"),
])
def test_bad_storage_is_one_line_naming_the_field(value: Any, message: str) -> None:
    with pytest.raises(StorageConfigError) as e:
        parse_storage(value, where="w")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_storage_file_with_bad_yaml_is_one_line_with_its_position(
    tmp_path: pathlib.Path
) -> None:
    bad = tmp_path / "storage.yaml"
    bad.write_text("type: s3\nbucket: [unclosed\n")
    with pytest.raises(StorageConfigError) as e:
        parse_storage(str(bad), where="w")
    assert f"{bad}: invalid YAML at line 3 column 1" in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gcsfs" else real(name, *a))
    with pytest.raises(StorageConfigError,
                       match=r"gs://b/p needs gcsfs: pip install 'determined_launch\[gcs\]'"):
        parse_storage("gs://b/p", where="w")


def test_import_stays_light() -> None:
    code = ("import sys, determined_launch, determined_launch.core; "
            "import determined_launch.core.storage; "
            "bad = [m for m in ('fsspec', 's3fs', 'adlfs', 'tensorboard', 'torch', 'yaml') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=base_env(), check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def _write_log(run: pathlib.Path, ckpts: list[tuple[str, int]],
               vals: list[tuple[int, float]]) -> None:
    run.mkdir(parents=True)
    (run / "checkpoints.jsonl").write_text("".join(
        json.dumps({"storage_id": s, "steps_completed": n}) + "\n" for s, n in ckpts))
    (run / "validation.jsonl").write_text("".join(
        json.dumps({"steps_completed": n, "metrics": {"loss": v}}) + "\n" for n, v in vals))


def test_retention_keeps_latest_and_best(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "runs" / "trial-1"
    _write_log(run, [("a", 1), ("b", 2), ("c", 3), ("d", 4)],
               [(1, 0.5), (2, 0.1), (3, 0.9), (4, 0.7)])
    env = {"DET_SEARCHER_METRIC": "loss"}
    policy = Retention(save_trial_latest=1, save_trial_best=1)
    assert retention.to_delete(policy, run, env) == ["a", "c"]
    assert retention.to_delete(policy, run, {**env, "DET_SMALLER_IS_BETTER": "false"}) == ["a", "b"]
    assert retention.to_delete(policy, run, {}) == ["a", "b", "c"]  # no metric: latest only
    _write_log(tmp_path / "runs" / "trial-2", [("z", 1)], [(1, 0.01)])
    wide = Retention(save_trial_latest=1, save_trial_best=0, save_experiment_best=2)
    assert retention.to_delete(wide, run, env) == ["a", "c"]  # z and b are the best two


def test_retention_through_core_init(tmp_path: pathlib.Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_SEARCHER_METRIC", "loss")
    block = {"type": "shared_fs", "host_path": str(tmp_path / "ck"),
             "save_trial_latest": 1, "save_trial_best": 1}
    with core.init(info=info(), run_dir=str(tmp_path / "run"), checkpoint_storage=block) as ctx:
        ids = []
        for step, loss in [(1, 0.2), (2, 0.9), (3, 0.8)]:
            ctx.train.report_validation_metrics(step, {"loss": loss})
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, sid):
                (path / "w").write_text(str(step))
            ids.append(sid)
        assert sorted(ctx.checkpoint.committed_ids()) == sorted([ids[0], ids[2]])
        assert ctx.checkpoint.latest() == ids[2]
    # Without a save_* policy nothing is ever deleted.
    with core.init(info=info(), run_dir=str(tmp_path / "run2"),
                   checkpoint_storage=str(tmp_path / "ck2")) as ctx:
        for step in range(3):
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                (path / "w").write_text("x")
        assert len(ctx.checkpoint.committed_ids()) == 3


def test_cluster_info_storage_is_used(tmp_path: pathlib.Path) -> None:
    with core.init(info=info(checkpoint_storage=f"file://{tmp_path}/from-info"),
                   run_dir=str(tmp_path / "run")) as ctx:
        assert ctx.checkpoint.storage_dir == tmp_path / "from-info"


def test_tensorboard_auto_on_a_directory_writes_the_run_dir_only(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tensorboard")
    script = f"""
import sys
from determined_launch import core
from determined_launch.cluster import ClusterInfo
info = ClusterInfo(container_addrs=("127.0.0.1",), container_rank=0, container_slot_counts=(1,),
                   slot_ids=(0,), source="test")
with core.init(info=info, run_dir={str(tmp_path / "run-a")!r},
               checkpoint_storage={str(tmp_path / "ck")!r}) as ctx:
    ctx.train.report_training_metrics(1, {{"loss": 0.5, "note": "text"}})
    ctx.train.report_validation_metrics(1, {{"loss": 0.4}})
    try:
        ctx.train.upload_tensorboard_files()
    except RuntimeError as e:
        print("refused:", e)
print("loaded:", [m for m in ("torch", "tensorboard", "numpy", "boto3") if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=base_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert "only be used in MANUAL mode" in out.stdout
    assert "loaded: []" in out.stdout  # event files need none of them (core/event_file.py)
    events = list((tmp_path / "run-a" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    assert _scalars(events[0].parent) == {("training/loss", 1, 0.5), ("validation/loss", 1, 0.4)}
    assert not (tmp_path / "ck" / "tensorboard").exists()  # a directory is not synced


def test_tensorboard_auto_syncs_to_object_storage_and_manual_uploads(
    tmp_path: pathlib.Path, s3_server: S3Server
) -> None:
    pytest.importorskip("tensorboard")
    block = s3_server.block(s3_server.new_bucket())
    with core.init(info=info(), run_dir=str(tmp_path / "run-a"), checkpoint_storage=block) as ctx:
        ctx.train.report_validation_metrics(3, {"loss": 0.25})
    fetched = tmp_path / "fetched"
    s3 = s3_server.client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=block["bucket"])["Contents"]]
    synced = [k for k in keys if k.startswith("exp/tensorboard/run-a/events.out.tfevents.")]
    assert len(synced) == 1, keys
    fetched.mkdir()
    s3.download_file(block["bucket"], synced[0], str(fetched / synced[0].rsplit("/", 1)[1]))
    assert _scalars(fetched) == {("validation/loss", 3, 0.25)}
    # a trial's directory is its number: in shared storage it is named as its records are
    with core.init(info=info(), run_dir=str(tmp_path / "exp-x" / "trials" / "1"),
                   checkpoint_storage=block) as ctx:
        ctx.train.report_validation_metrics(3, {"loss": 0.25})
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=block["bucket"])["Contents"]]
    assert any(k.startswith("exp/tensorboard/exp-x.trial-1/events.") for k in keys), keys
    assert not any(k.startswith("exp/tensorboard/1/") for k in keys), keys

    ck = tmp_path / "ck"
    with core.init(info=info(), run_dir=str(tmp_path / "run-m"), checkpoint_storage=str(ck),
                   tensorboard_mode=core.TensorboardMode.MANUAL) as ctx:
        ctx.train.report_training_metrics(1, {"loss": 0.5})
        assert not ctx.train.get_tensorboard_path().exists()  # MANUAL writes nothing
        ctx.train.get_tensorboard_path().mkdir(parents=True)
        (ctx.train.get_tensorboard_path() / "mine.txt").write_text("x")
        ctx.train.upload_tensorboard_files(mangler=lambda p, rank: p.with_name(f"r{rank}-{p.name}"))
    assert (ck / "tensorboard" / "run-m" / "r0-mine.txt").read_text() == "x"


def _scalars(logdir: pathlib.Path) -> set[tuple[str, int, float]]:
    """(tag, step, value) of every scalar, read back by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {(tag, e.step, round(e.value, 6))
            for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}


def test_gc_cli(tmp_path: pathlib.Path) -> None:
    storage = tmp_path / "ck"
    with core.init(info=info(), run_dir=str(tmp_path / "run"),
                   checkpoint_storage=str(storage)) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, good):
            (path / "w").write_text("x")
    (storage / ".partial-dead").mkdir()
    cmd = [sys.executable, "-m", "determined_launch.cli", "checkpoints"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cmd, *args], capture_output=True, text=True, env=base_env(),
                              cwd=REPO, timeout=60)

    out = run("gc", str(storage))
    assert out.returncode == 0 and "1 committed checkpoint(s), 1 leftover(s)" in out.stdout
    assert "leftover dead" in out.stdout and (storage / ".partial-dead").is_dir()
    out = run("gc", str(storage), "--remove")
    assert "removed dead" in out.stdout and not (storage / ".partial-dead").exists()
    assert (storage / good / "metadata.json").is_file()
    out = run("list", str(storage))
    assert out.stdout.startswith(good) and "steps_completed" in out.stdout
    out = run("gc", "ftp://nowhere/x")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "unsupported scheme" in out.stderr
    assert run("gc").returncode == 2


def test_tensorboard_synced_to_object_storage(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tensorboard")
    import fsspec

    url = f"memory://tb-{tmp_path.name}/exp"
    with core.init(info=info(), run_dir=str(tmp_path / "run-o"), checkpoint_storage=url) as ctx:
        ctx.train.report_training_metrics(1, {"loss": 0.5})
        ctx.train.report_training_metrics(2, {"loss": 0.25})
    found = fsspec.filesystem("memory").find(f"/tb-{tmp_path.name}/exp/tensorboard/run-o")
    assert len(found) == 1 and "events.out.tfevents" in found[0]
    local = next((tmp_path / "run-o" / "tensorboard").glob("events.out.tfevents.*"))
    assert fsspec.filesystem("memory").cat_file(found[0]) == local.read_bytes()  # final sync
    assert _scalars(local.parent) == {("training/loss", 1, 0.5), ("training/loss", 2, 0.25)}


@pytest.mark.parametrize("url", ["dir", "memory"])
def test_commit_checks_every_reported_file(url: str, tmp_path: pathlib.Path) -> None:
    from determined_launch.core.storage import open_storage

    where = str(tmp_path / "ck") if url == "dir" else f"memory://c-{tmp_path.name}/x"
    backend = open_storage(parse_storage(where, where="t"))
    staging = backend.begin("s1")
    (staging / "a").write_bytes(b"12345")
    backend.put("s1", staging, {"a": 5})
    with pytest.raises(RuntimeError, match="s1 .*not committed: b is missing"):
        backend.commit("s1", {}, {"a": 5, "b": 1})
    if url == "memory":  # sizes are compared too
        with pytest.raises(RuntimeError, match="a is 5 bytes, not 6"):
            backend.commit("s1", {}, {"a": 6})
    assert not backend.is_committed("s1")
    backend.commit("s1", {"k": 1}, {"a": 5})
    assert backend.is_committed("s1") and backend.get_metadata("s1") == {"k": 1}


def test_transfer_retries_backoff_and_progress(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import time

    from determined_launch.core.storage import transfer

    monkeypatch.setattr(transfer, "_BACKOFF_BASE", 0.01)
    monkeypatch.setattr(transfer, "PROGRESS_AFTER", 0.0)
    monkeypatch.setenv("DET_STORAGE_RETRIES", "3")
    calls = {"flaky": 0, "dead": 0, "denied": 0}

    def flaky() -> None:
        calls["flaky"] += 1
        time.sleep(0.05)
        if calls["flaky"] < 3:
            raise OSError("503 Slow Down")

    caplog.set_level(logging.INFO, "determined_launch.core")
    transfer.run_parallel([("f", 10 << 20, flaky)], verb="uploading", label="id1", url="s3://b/p")
    assert calls["flaky"] == 3
    assert any("uploading id1: " in r.getMessage() and "MB" in r.getMessage()
               for r in caplog.records)

    def dead() -> None:
        calls["dead"] += 1
        raise OSError("connection refused")

    with pytest.raises(transfer.StorageTransferError) as e:
        transfer.run_parallel([("model.pt", 1, dead)], verb="uploading", label="id2",
                              url="s3://b/p")
    assert calls["dead"] == 3
    assert str(e.value) == ("uploading checkpoint id2 at s3://b/p failed after 3 attempt(s): "
                            "model.pt: OSError: connection refused")

    def denied() -> None:
        calls["denied"] += 1
        raise PermissionError("AccessDenied")

    with pytest.raises(transfer.StorageTransferError, match="PermissionError"):
        transfer.run_parallel([("m", 1, denied)], verb="uploading", label="id3", url="s3://b")
    assert calls["denied"] == 1  # refused credentials do not heal: no retry
    monkeypatch.setenv("DET_STORAGE_RETRIES", "zero")
    with pytest.raises(transfer.StorageTransferError, match="DET_STORAGE_RETRIES='zero'"):
        transfer.attempts()
