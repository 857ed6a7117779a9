"""Experiments whose checkpoint storage is object storage: the driver syncs the
experiment's record, journal and trial logs there (experiment/sync.py) and
``det-launch ui s3://...`` shows the experiment page from them, against moto's
real S3 server (tests/storage_servers.py)."""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from determined_launch.experiment import sync as exp_sync
from determined_launch.experiment.sync import ExperimentSync
from tests._ui_helpers import Served
from tests.conftest import base_env
from tests.test_ui_storage import _s3_env

CONFIG = """\
name: s3-demo
entrypoint: python3 train.py
hyperparameters:
  lr: {type: log, minval: -3, maxval: -1}
searcher:
  name: random
  metric: loss
  smaller_is_better: true
  max_length: 3
  max_trials: 1
max_restarts: 0
checkpoint_storage: STORAGE
"""

TRAIN = """\
import pathlib
import determined_launch as det
from determined_launch import core

lr = det.get_cluster_info().trial.hparams["lr"]
with core.init() as ctx:
    for step in (1, 2, 3):
        ctx.train.report_training_metrics(step, {"loss": lr * 10 / step})
        print(f"step {step} lr {lr}", flush=True)
    ctx.train.report_validation_metrics(3, {"loss": lr})
    with ctx.checkpoint.store_path({"steps_completed": 3}) as (path, _):
        (pathlib.Path(path) / "weights.bin").write_bytes(bytes(4096))
"""


def test_an_experiment_in_s3_is_served_from_s3(tmp_path: pathlib.Path, s3_server: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("optuna")
    bucket = s3_server.new_bucket()
    storage = f"s3://{bucket}/prefix"
    (tmp_path / "exp.yaml").write_text(CONFIG.replace("STORAGE", storage))
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "experiment", "exp.yaml"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=base_env(**_s3_env(s3_server)))
    assert r.returncode == 0, r.stdout + r.stderr
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(
        Bucket=bucket, Prefix="prefix/")["Contents"]}
    assert {"prefix/experiments/s3-demo/experiment.json",
            "prefix/experiments/s3-demo/study.journal",
            "prefix/runs/s3-demo.trial-1/output.log",
            "prefix/runs/s3-demo.trial-1/validation.jsonl"} <= keys, keys
    shutil.rmtree(tmp_path / "det_experiments")  # what follows reads the storage only

    for var, value in _s3_env(s3_server).items():
        monkeypatch.setenv(var, value)
    served = Served(storage)
    try:
        [exp] = served.json("/api/v1/experiments")
        assert (exp["name"], exp["state"], exp["num_trials"]) == ("s3-demo", "completed", 1)
        [trial] = served.json("/api/v1/experiments/s3-demo/trials")
        lr = trial["hparams"]["lr"]
        assert (trial["trial_id"], trial["state"], trial["length"]) == (1, "completed", 3)
        assert trial["best_value"] == pytest.approx(lr) and 1e-3 <= lr <= 0.1
        assert exp["best_trial"] == {"trial_id": 1, "value": pytest.approx(lr)}
        [curve] = served.json("/api/v1/experiments/s3-demo/searcher_metric")
        assert curve["points"] == [[3, pytest.approx(lr)]]
        assert served.json("/api/v1/runs") == []  # the trial's run is the trial
        base = "/api/v1/experiments/s3-demo/trials/1"
        assert served.json(base)["exit_status"] == 0  # the launcher's line in the log
        training = served.json(f"{base}/metrics?group=training")
        assert [m["steps_completed"] for m in training] == [1, 2, 3]
        [ck] = served.json(f"{base}/checkpoints")
        assert (ck["state"], ck["steps_completed"], ck["storage"]) == ("COMPLETED", 3, storage)
        assert 4096 < ck["size"] < 4096 + 1000 and ck["metadata"]["steps_completed"] == 3
        status, _, logs = served.get(f"{base}/logs")
        assert status == 200 and f"step 3 lr {lr}" in logs.decode()
        assert "testing" not in json.dumps(served.json(base))  # no credentials on a page
    finally:
        served.stop()


def test_the_mirror_places_trials_in_their_experiment(
        tmp_path: pathlib.Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_launch.ui import remote

    for var, value in _s3_env(s3_server).items():
        monkeypatch.setenv(var, value)
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()

    def put(key: str, body: bytes) -> None:
        s3.put_object(Bucket=bucket, Key=f"p/{key}", Body=body)

    line = b"[rank=0] hello\n"
    put("runs/ex.trial-1/training.jsonl", b'{"steps_completed": 1, "metrics": {"x": 1}}\n')
    put("runs/ex.trial-1/output.log", line)
    put("runs/ex.trial-1/cluster_info.json", b"{}")  # never mirrored
    put("experiments/ex/study.journal", b"{}\n")  # no record yet: no experiment
    mirror = remote.Mirror(f"s3://{bucket}/p")
    try:
        mirror.first_sync()
        assert (mirror.local / "runs" / "ex.trial-1" / "output.log").read_bytes() == line
        assert not (mirror.local / "experiments" / "ex" / "experiment.json").exists()
        put("experiments/ex/experiment.json", b'{"name": "ex"}')  # the commit
        mirror.sync()
        trial = mirror.local / "experiments" / "ex" / "trials" / "1"
        assert (trial / "output.log").read_bytes() == line
        assert sorted(p.name for p in trial.iterdir()) == ["output.log", "training.jsonl"]
        assert not (mirror.local / "runs" / "ex.trial-1").exists()  # moved, not twice
        inode = (trial / "output.log").stat().st_ino
        put("runs/ex.trial-1/output.log", line * 3)
        mirror.sync()
        assert (trial / "output.log").read_bytes() == line * 3
        assert (trial / "output.log").stat().st_ino == inode  # appended, not fetched whole

        # Checkpoints: size and URL from the storage; committed by metadata.json.
        monkeypatch.setattr(remote, "PERIOD", 0.0)
        put("ck-1/weights.bin", bytes(1000))
        put("ck-1/sub/more.bin", bytes(24))
        # data without its commit marker: uncommitted (issue 34 §10), not deleted
        assert mirror.checkpoint("ck-1") == {"size": 1024, "storage": f"s3://{bucket}/p",
                                             "found": False, "unmarked": True, "metadata": None}
        put("ck-1/metadata.json", b'{"steps_completed": 5}')
        entry = mirror.checkpoint("ck-1")
        assert (entry["found"], entry["size"], entry["metadata"]) == (
            True, 1024 + 22, {"steps_completed": 5})
        s3.delete_object(Bucket=bucket, Key="p/ck-1/metadata.json")
        assert mirror.checkpoint("ck-1")["found"]  # committed: reused for CHECKPOINT_TTL
        assert mirror.checkpoint("no-such")["found"] is False
    finally:
        mirror.close()
    put("runs/ex2.trial-1/training.jsonl", b"{}\n")  # another experiment's trial
    put("runs/plain/training.jsonl", b"{}\n")
    one = remote.Mirror(f"s3://{bucket}/p/experiments/ex")  # a PATH may be one experiment
    try:
        one.first_sync()
        files = sorted(str(p.relative_to(one.local)) for p in one.local.rglob("*") if p.is_file())
        assert files == ["experiment.json", "study.journal", "trials/1/output.log",
                         "trials/1/training.jsonl"] and one.root == f"{bucket}/p"
        from determined_launch.ui.api import Api

        api = Api([str(one.local)], remotes=[(str(one.local), one)])
        assert list(api.catalog.experiments()) == ["ex"] and api.experiment_storage("ex") == [one]
    finally:
        one.close()


def _recorder() -> tuple[dict[str, bytes], list[str], Any]:
    stored: dict[str, bytes] = {}
    order: list[str] = []

    def upload(name: str, local: pathlib.Path) -> None:
        stored[name] = local.read_bytes()
        order.append(name)

    return stored, order, upload


def _experiment(tmp_path: pathlib.Path) -> pathlib.Path:
    exp = tmp_path / "my-exp"
    (exp / "trials" / "1").mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps({"name": "e", "storage": "/elsewhere/j"}))
    return exp


def test_the_record_is_the_commit_and_the_journal_whole_lines(tmp_path: pathlib.Path) -> None:
    exp = _experiment(tmp_path)
    journal = tmp_path / "j"
    journal.write_bytes(b'{"op_code": 0}\n{"op_code": 1}\n{"op_co')  # a line being written
    stored, order, upload = _recorder()
    sync = ExperimentSync(exp, journal, upload)
    assert sync.sync(journal=True, logs=False) == ["experiments/my-exp/study.journal",
                                                   "experiments/my-exp/experiment.json"]
    assert stored["experiments/my-exp/study.journal"] == b'{"op_code": 0}\n{"op_code": 1}\n'
    # The copy beside the record is the study, wherever it was locally.
    assert json.loads(stored["experiments/my-exp/experiment.json"])["storage"] is None
    assert sync.sync() == []  # nothing changed
    with open(journal, "ab") as f:
        f.write(b'de": 2}\n')
    assert sync.sync() == ["experiments/my-exp/study.journal"]  # the record once only
    assert stored["experiments/my-exp/study.journal"].endswith(b'{"op_code": 2}\n')
    sync.close()

    # The record never goes before the study it points to.
    early: dict[str, bytes] = {}

    def journal_fails(name: str, local: pathlib.Path) -> None:
        if name.endswith("study.journal"):
            raise OSError("storage down")
        early[name] = local.read_bytes()

    with pytest.raises(OSError):
        ExperimentSync(exp, journal, journal_fails).sync()
    assert early == {}


def test_logs_are_synced_periodically_not_per_line(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(exp_sync, "LOG_PERIOD", 0.2)
    monkeypatch.setattr(exp_sync, "_MIN_GAP", 0.05)
    exp = _experiment(tmp_path)
    log = exp / "trials" / "1" / "output.log"
    stored, order, upload = _recorder()
    sync = ExperimentSync(exp, None, upload)  # a database study: the record only
    sync.start()
    deadline = time.monotonic() + 10
    while not order and time.monotonic() < deadline:  # the first upload, in the background
        time.sleep(0.01)
    assert order == ["experiments/my-exp/experiment.json"]
    sync.running([(1, exp / "trials" / "1")])
    stop = time.monotonic() + 1.0
    lines = 0
    with open(log, "a") as f:
        while time.monotonic() < stop:
            f.write(f"[rank=0] line {lines}\n")
            f.flush()
            lines += 1
            time.sleep(0.002)
    sync.running([])  # the trial ended
    sync.changed()
    sync.close()
    name = "runs/my-exp.trial-1/output.log"
    assert stored[name] == log.read_bytes() and lines > 100
    assert 3 <= order.count(name) <= 10, order.count(name)  # every 0.2 s and at the end

    # A failing storage is one warning, and the search goes on.
    def failing(name: str, local: pathlib.Path) -> None:
        raise OSError("storage down")

    broken = ExperimentSync(exp, None, failing)
    with caplog.at_level(logging.WARNING, logger="determined_launch.experiment"):
        broken.start()
        broken.running([(1, exp / "trials" / "1")])
        broken.changed()
        time.sleep(0.3)
        broken.close()
    warned = [r for r in caplog.records if "experiment to storage failed" in r.getMessage()]
    assert len(warned) == 1 and "storage down" in warned[0].getMessage()
