"""--report-to mlflow,wandb: real trackers, read back with their own clients.

MLflow: one real ``mlflow server`` (SQLite backend) on loopback for the
session, started in the background by the first test so its slow start
overlaps the others, read back with ``MlflowClient``. W&B: offline mode
(``WANDB_MODE=offline``, no network); its transaction log (``run-<id>.wandb``)
is read with wandb's own record definitions (``wandb_internal_pb2.Record``;
wandb >= 0.23 ships no Python reader of the file, so the LevelDB-log framing
is read here).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from determined_launch import values
from determined_launch.core import trackers
from determined_launch.errors import LaunchError
from determined_launch.launch import config
from tests._ports import free_port
from tests.conftest import REPO, base_env

mlflow_tracking = pytest.importorskip("mlflow.tracking")
pytest.importorskip("wandb")

_SERVER: dict[str, Any] = {}


@pytest.fixture(scope="session")
def _mlflow_started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Start ``mlflow server`` without waiting (its own session, so its uvicorn
    worker goes with it); ``mlflow_uri`` waits for it."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    env = dict(base_env(), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--default-artifact-root", str(root / "artifacts"), "--workers", "1"],
        env=env, stdout=open(root / "server.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    _SERVER.update(proc=proc, uri=f"http://127.0.0.1:{port}", log=root / "server.log")
    yield
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


pytestmark = pytest.mark.usefixtures("_mlflow_started")


@pytest.fixture
def mlflow_uri() -> str:
    deadline = time.monotonic() + 240  # a loaded 2-core VM: tens of seconds
    while True:
        try:
            with urllib.request.urlopen(_SERVER["uri"] + "/health", timeout=2):
                return str(_SERVER["uri"])
        except OSError:
            if _SERVER["proc"].poll() is not None or time.monotonic() > deadline:
                raise AssertionError(Path(_SERVER["log"]).read_text()[-3000:]) from None
            time.sleep(0.25)


# --- the option and the missing package ------------------------------------------


def test_report_to_names_tools_once_and_refuses_others() -> None:
    assert values.trackers(" MLflow, wandb,mlflow,") == ("mlflow", "wandb")
    assert config.resolve({"DET_REPORT_TO": "wandb"})["report_to"] == ("wandb",)
    with pytest.raises(LaunchError, match="DET_REPORT_TO: expected one of mlflow, wandb"):
        config.resolve({"DET_REPORT_TO": "mlflow,comet"})


def test_a_missing_package_is_one_line_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(trackers.PACKAGES, "mlflow", ("no_such_module_here", "mlflow"))
    with pytest.raises(LaunchError) as e:
        trackers.check_trackers(["mlflow"])
    assert str(e.value) == ("--report-to mlflow needs the no_such_module_here package: "
                            "pip install 'determined_launch[mlflow]'")
    # In a bare process (no launcher to refuse it): one warning, training goes on.
    who = trackers.identity(tmp_path / "run", None, None)
    assert trackers.open_trackers(["mlflow"], who, resuming=False) is None
    assert [r.getMessage() for r in caplog.records] == [
        str(e.value) + "; reporting without it"]


def test_the_final_state_of_a_core_context_block() -> None:
    from determined_launch import InvalidHP

    assert trackers.final_state(None, preempted=False) == "completed"
    assert trackers.final_state(None, preempted=True) == "preempted"
    assert trackers.final_state(SystemExit(0), preempted=False) == "completed"
    assert trackers.final_state(SystemExit(3), preempted=False) == "errored"
    assert trackers.final_state(ValueError("x"), preempted=True) == "errored"
    assert trackers.final_state(InvalidHP("x"), preempted=False) == "invalid"
    # a stop the experiment's driver asked for says why (experiment/trial.py's stop_reason.json)
    assert trackers.final_state(None, True, "pruned") == "stopped (ASHA)"
    assert trackers.final_state(None, True, "done") == "completed"
    assert trackers.final_state(None, True, "driver") == "preempted"
    assert trackers.final_state(None, True, "bogus") == "preempted"
    from determined_launch.core.trackers._mlflow import STATUS

    assert set(trackers.STATES) <= set(STATUS)  # every state has an MLflow status


# --- a tracker never stops or slows training ------------------------------------


def test_a_tracker_that_never_answers_costs_the_flush_bound_then_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # A real MLflow client against a port that accepts and never answers.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{hole.getsockname()[1]}")
    try:
        who = trackers.identity(tmp_path / "run", 1, {"lr": 0.1})
        sink = trackers.open_trackers(["mlflow"], who, resuming=False, flush_seconds=1.0)
        assert sink is not None
        started = time.perf_counter()
        for step in range(1, 20_001):  # more than the queue holds: the rest are counted
            sink.report("training", step, {"loss": 1.0 / step})
        assert time.perf_counter() - started < 5  # never waits for the tracker
        started = time.monotonic()
        sink.close("completed")
        assert 0.9 < time.monotonic() - started < 3
    finally:
        hole.close()
    # Ours only: the abandoned delivery thread may still log urllib3's retry warning
    # when the hole closes (CI saw "Retrying ... Connection reset by peer").
    lines = [r.getMessage() for r in caplog.records
             if r.levelno >= logging.WARNING and r.name.startswith("determined_launch")]
    assert lines == ["mlflow: gave up delivering after the flush deadline; 20000 reports not "
                     "delivered (the run's status may show it as still running)"]


WORKER = """\
from determined_launch import core
ctx = core.init()  # never closed: the trackers close at exit
for step in range(1, 4):
    ctx.train.report_training_metrics(step, {"loss": 1.0 / step})
with ctx.checkpoint.store_path({"steps_completed": 3}) as (path, _):
    (path / "w").write_text("w")
print("trained to the end")
"""


def test_a_dead_tracker_url_lets_training_finish_with_exit_0(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(WORKER)
    # A bare process (the search below passes --report-to through the launchers).
    env = base_env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{free_port()}",
                   MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", DET_RUN_DIR=str(tmp_path / "run"),
                   DET_REPORT_TO="mlflow")
    r = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "trained to the end" in out and "Traceback" not in out
    warned = [line for line in out.splitlines() if "mlflow could not start its run" in line]
    assert len(warned) == 1, out
    assert "training goes on without it" in warned[0]
    assert "mlflow: 4 reports not delivered" in out  # 3 reports + the checkpoint's tags
    assert not (tmp_path / "run" / trackers.STATE_FILE).exists()


# --- one tracker run per trial, across restarts ----------------------------------


def _life(steps: range, checkpoint_at: int, preempt: bool) -> str:
    from determined_launch import core

    with core.init() as ctx:
        resumed = ctx.info.latest_checkpoint or ""
        for step in steps:
            ctx.train.report_training_metrics(step, {"loss": 1.0 / step, "note": "text"})
            if step == checkpoint_at:
                ctx.train.report_validation_metrics(step, {"accuracy": step / 10})
                with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                    (path / "model").write_text(str(step))
        if preempt:
            ctx.preempt.request_preemption("test")
            assert ctx.preempt.should_preempt()
    return resumed


def _wandb_records(path: Path) -> Iterator[Any]:
    """The records of a ``.wandb`` transaction log: a 7-byte file header, then
    LevelDB log framing (32 KiB blocks; 7-byte chunk headers: crc, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7])[:2] == (b":W&B", 0xBEE1)
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def test_preempt_and_resume_continue_one_run_with_each_step_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_uri: str) -> None:
    run_dir = tmp_path / "my-run"
    for key, value in {"DET_RUN_DIR": str(run_dir), "DET_REPORT_TO": "mlflow,wandb,tensorboard",
                       "DET_CHECKPOINT_STORAGE": str(tmp_path / "ckpt"),
                       "DET_LAUNCH_HPARAMS": '{"lr": 0.1, "opt": {"name": "sgd"}}',
                       "MLFLOW_TRACKING_URI": mlflow_uri,
                       "MLFLOW_EXPERIMENT_NAME": "resume-test",
                       "WANDB_MODE": "offline", "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    for var in ("WANDB_DIR", "WANDB_PROJECT", "DET_CLUSTER_INFO_FILE"):
        monkeypatch.delenv(var, raising=False)
    # Life 1 checkpoints at 4, reports 5 and 6, and is preempted; life 2 resumes
    # from 4, trains 5..8 again: 5 and 6 were delivered already and are not repeated.
    assert _life(range(1, 7), checkpoint_at=4, preempt=True) == ""
    ids = json.loads((run_dir / trackers.STATE_FILE).read_text())
    client = mlflow_tracking.MlflowClient(mlflow_uri)
    run = client.get_run(ids["mlflow"]["run_id"])
    assert (run.info.status, run.data.tags["det.state"]) == ("KILLED", "preempted")
    assert _life(range(5, 9), checkpoint_at=8, preempt=False) != ""
    assert json.loads((run_dir / trackers.STATE_FILE).read_text())["mlflow"]["run_id"] == \
        ids["mlflow"]["run_id"]

    experiment = client.get_experiment_by_name("resume-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == ids["mlflow"]["run_id"] and run.info.run_name == "my-run"
    assert (run.info.status, run.data.tags["det.state"]) == ("FINISHED", "completed")
    assert run.data.params == {"lr": "0.1", "opt.name": "sgd"}
    latest = json.loads((run_dir / "latest_checkpoint.json").read_text())["storage_id"]
    assert run.data.tags["det.checkpoint"] == latest
    assert run.data.tags["det.checkpoint_url"] == f"{tmp_path / 'ckpt'}/{latest}"
    history = client.get_metric_history(run.info.run_id, "training/loss")
    assert sorted(m.step for m in history) == list(range(1, 9))
    assert [m.step for m in client.get_metric_history(run.info.run_id,
                                                      "validation/accuracy")] == [4, 8]
    assert "training/note" not in run.data.metrics  # not a number: not plotted

    # W&B: two offline files (one per life) of the same run id, each step once.
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [f.name for f in files] == [f"run-{ids['wandb']['run_id']}.wandb"] * 2
    steps: list[int] = []
    exits = []
    for f in files:
        for record in _wandb_records(f):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                assert (record.run.run_group, record.run.display_name) == ("", "my-run")
                config_json = {i.key: json.loads(i.value_json) for i in record.run.config.update}
                assert config_json["lr"] == 0.1
            elif kind == "history":
                row = {("".join(i.nested_key) or i.key): json.loads(i.value_json)
                       for i in record.history.item}
                if "training/loss" in row:
                    steps.append(row["steps_completed"])
            elif kind == "exit":
                exits.append(record.exit.exit_code)
    assert sorted(steps) == list(range(1, 9)) and exits == [0, 0]

    # TensorBoard: one HParams session (not repeated by the resumed life), read by its loader.
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    sessions = []
    for f in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(f)).Load():
            for v in event.summary.value:
                if v.tag == metadata.SESSION_START_INFO_TAG:
                    sessions.append(metadata.parse_session_start_info_plugin_data(
                        v.metadata.plugin_data.content))
    assert len(sessions) == 1
    assert {k: v.WhichOneof("kind") for k, v in sessions[0].hparams.items()} == {
        "lr": "number_value", "opt.name": "string_value"}
    assert sessions[0].hparams["lr"].number_value == 0.1


# --- a search: one run per trial ---------------------------------------------------


def test_a_search_gives_one_run_per_trial_with_its_params(
        tmp_path: Path, mlflow_uri: str) -> None:
    pytest.importorskip("optuna")
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(json.dumps({
        "name": "tracked", "max_restarts": 0,
        "hyperparameters": {"x": {"type": "categorical", "vals": [0.2, 0.7]}, "period": 2},
        "searcher": {"name": "grid", "metric": "loss", "max_length": {"batches": 4},
                     "max_concurrent_trials": 2}}))
    env = base_env(MLFLOW_TRACKING_URI=mlflow_uri, WANDB_MODE="offline")
    r = subprocess.run(
        [sys.executable, "-m", "determined_launch.cli", "experiment", str(cfg),
         "--experiment-dir", str(tmp_path / "exp"), "--report-to", "mlflow,tensorboard",
         "exec", "--", sys.executable, str(REPO / "tests" / "search" / "trial_script.py")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    client = mlflow_tracking.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("tracked")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["tracked/trial-1", "tracked/trial-2"]
    assert sorted(run.data.params["x"] for run in runs.values()) == ["0.2", "0.7"]
    for name, run in runs.items():
        assert run.data.tags["det.trial_id"] == name[-1]
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "validation/loss")]
        assert steps == [2, 4]
        trial_dir = tmp_path / "exp" / "trials" / name[-1]
        assert len(list((trial_dir / "tensorboard").glob("*.hparams"))) == 1  # HParams tab


def test_a_trial_killed_outright_ends_its_mlflow_run_as_failed(
        tmp_path: Path, mlflow_uri: str) -> None:
    """SIGKILL (the OOM killer) leaves nothing in the trial to end its run: the
    driver, giving the trial up, ends it instead of leaving it RUNNING forever."""
    pytest.importorskip("optuna")
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(json.dumps({
        "name": "killed", "max_restarts": 0,
        "hyperparameters": {"x": 0.7, "period": 1, "kill_self_at": 2},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 4}}}))
    env = base_env(MLFLOW_TRACKING_URI=mlflow_uri)
    r = subprocess.run(
        [sys.executable, "-m", "determined_launch.cli", "experiment", str(cfg),
         "--experiment-dir", str(tmp_path / "exp"), "--report-to", "mlflow",
         "exec", "--", sys.executable, str(REPO / "tests" / "search" / "trial_script.py")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "trial 1: failed with exit status" in out, out
    client = mlflow_tracking.MlflowClient(mlflow_uri)
    [run] = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert (run.info.status, run.data.tags["det.state"]) == ("FAILED", "errored"), out
    assert f"trial 1: mlflow: run {run.info.run_id} ended as errored" in out


def test_reports_keep_flowing_while_the_tracker_thread_is_busy(tmp_path: Path) -> None:
    # The training thread's cost does not depend on the tracker: a sink whose
    # backend blocks still takes reports (queued, then counted once full).
    gate = threading.Event()

    class Blocked:
        name = "blocked"

        def start(self, resume_id: Any) -> str:
            gate.wait(5)
            return "id"

        def log(self, records: Any) -> None: ...

        def tag(self, tags: Any) -> None: ...

        def finish(self, state: str) -> None: ...

    state = trackers._State(tmp_path / "t.json", resuming=False)
    sink = trackers.Sink(Blocked(), None, {}, state, limit=10)
    for step in range(25):
        sink.put(("metrics", "training", step, {"loss": 1.0}))
    assert sink.dropped == 15
    gate.set()
    sink.close("completed", time.monotonic() + 5)
    assert json.loads((tmp_path / "t.json").read_text())["blocked"]["seen"] == {"training": 9}
