"""The rest of determined.core 0.38.1's surface (issue 15, item 6): each
master-backed call does the closest useful local thing."""

from __future__ import annotations

import http.server
import json
import logging
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import determined_launch as det
from determined_launch import core
from determined_launch.core._rundir import read_jsonl
from determined_launch.errors import LaunchError
from determined_launch.launch import config
from tests.test_core_api import make_context, make_info, solo

#: determined.core's public names in 0.38.1 that this helper owns (others:
#: TensorboardMode, DownloadMode, SearcherMode, Unit belong to other work).
CORE_NAMES = [
    "CheckpointContext", "Context", "DistributedContext", "DummyCheckpointContext",
    "DummyDistributedContext", "DummyExperimentalCoreContext", "DummyPreemptContext",
    "DummyProfilerContext", "DummySearcherContext", "DummySearcherOperation",
    "DummyTrainContext", "EarlyExitReason", "ExperimentalCoreContext", "PreemptContext",
    "PreemptMode", "ProfilerContext", "SearcherContext", "SearcherContextMissing",
    "SearcherOperation", "TrainContext", "init", "_dummy_init",
]


def test_core_and_top_level_names_exist() -> None:
    missing = [n for n in CORE_NAMES if not hasattr(core, n)]
    assert missing == []
    assert core.EarlyExitReason.INVALID_HP.value == "EXITED_REASON_INVALID_HP"
    r = det.RendezvousInfo(["a", "b"], 1, [2, 2])
    assert (r.container_addrs, r.container_rank, r.container_slot_counts) == (["a", "b"], 1, [2, 2])
    assert det.ResourcesInfo(["GPU-1"]).gpu_uuids == ["GPU-1"]


def test_status_metadata_and_early_exit_live_in_the_run_dir(tmp_path: pathlib.Path) -> None:
    with make_context(tmp_path, solo()) as ctx:
        assert ctx.train.get_metadata() == {}
        assert ctx.train.set_metadata({"a": 1}) == {"a": 1}
        ctx.train.set_metadata({"b": [2]})
        assert ctx.train.get_metadata() == {"b": [2]}
        with pytest.raises(TypeError, match="takes a dict"):
            ctx.train.set_metadata([1])  # type: ignore[arg-type]
        ctx.train.set_status("warming up")
        ctx.train.report_early_exit(core.EarlyExitReason.USER_REQUESTED_STOP)
        with pytest.raises(ValueError):
            ctx.train.report_early_exit("bogus")  # type: ignore[arg-type]
        assert ctx.train.get_experiment_best_validation() is None
    run = tmp_path / "run"
    assert json.loads((run / "status.json").read_text()) == {"status": "warming up"}
    assert json.loads((run / "early_exit.json").read_text()) == {
        "reason": "EXITED_REASON_USER_REQUESTED_STOP"}


def test_invalid_hp_leaving_the_block_is_an_early_exit_with_status_0(
    tmp_path: pathlib.Path,
) -> None:
    with pytest.raises(SystemExit) as e:
        with make_context(tmp_path, solo()):
            raise det.InvalidHP("lr too large")
    assert e.value.code == 0
    assert "INVALID_HP" in (tmp_path / "run" / "early_exit.json").read_text()


def test_start_and_experimental(tmp_path: pathlib.Path) -> None:
    ctx = make_context(tmp_path, solo())
    ctx.start()
    ctx.experimental.report_task_using_checkpoint("ckpt-1")
    ctx.close()
    (record,) = read_jsonl(tmp_path / "run" / "task_sources.jsonl")
    assert record["checkpoint_uuid"] == "ckpt-1" and record["trial_id"] == 7


def test_profiler_samples_into_the_run_dir(tmp_path: pathlib.Path) -> None:
    with make_context(tmp_path, solo()) as ctx:
        with pytest.raises(ValueError, match="sampling_interval"):
            ctx.profiler.on(sampling_interval=0.01)
        with pytest.raises(ValueError, match="samples_per_report"):
            ctx.profiler.on(samples_per_report=0)
        ctx.profiler.on(sampling_interval=0.1, samples_per_report=2)
        ctx.profiler.on()  # idempotent
        path = tmp_path / "run" / "profiler.jsonl"
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        ctx.profiler.off()
        ctx.profiler.off()
    records = read_jsonl(path)
    assert records and records[0]["node"] == 0
    assert 0 <= records[0]["cpu"]["cpu_util_simple"] <= 100
    assert records[0]["memory"]["free_memory"] > 0
    assert not any(t.name == "det-profiler" for t in threading.enumerate())


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def webhook() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook?token=SECRET"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_alert_is_a_log_line_and_a_webhook_when_configured(
    tmp_path: pathlib.Path, webhook: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="determined_launch.core")
    with make_context(tmp_path, solo()) as ctx:
        monkeypatch.delenv("DET_ALERT_WEBHOOK", raising=False)
        ctx.alert("loss diverged", "nan at step 10", level="warn")
        assert _Hook.received == []
        monkeypatch.setenv("DET_ALERT_WEBHOOK", webhook)
        ctx.alert(title="done")
        with pytest.raises(ValueError, match="alert level"):
            ctx.alert("x", level="loud")  # type: ignore[arg-type]
    assert any(r.levelno == logging.WARNING and "loss diverged: nan at step 10" in r.message
               for r in caplog.records)
    assert _Hook.received == [{"title": "done", "description": "", "level": "info",
                               "trial_id": 7, "experiment_id": None,
                               "host": _Hook.received[0]["host"]}]


def test_a_broken_webhook_warns_without_leaking_the_url(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DET_ALERT_WEBHOOK", f"http://127.0.0.1:{port}/x?token=SECRET")
    with make_context(tmp_path, solo()) as ctx:
        ctx.alert("t")
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "webhook http://127.0.0.1 failed" in warnings[0]
    assert "SECRET" not in caplog.text
    monkeypatch.setenv("DET_ALERT_WEBHOOK", "ftp://x")
    with make_context(tmp_path, solo()) as ctx, pytest.raises(ValueError, match="DET_ALERT"):
        ctx.alert("t")


def test_the_launcher_checks_the_webhook_before_starting() -> None:
    with pytest.raises(LaunchError, match="DET_ALERT_WEBHOOK: expected an http"):
        config.resolve({"DET_ALERT_WEBHOOK": "slack.example/token"})


def test_dummy_contexts(tmp_path: pathlib.Path) -> None:
    dist = core.DummyDistributedContext()
    assert (dist.rank, dist.size, dist.allgather(5)) == (0, 1, [5])
    with pytest.raises(RuntimeError, match="before start"):
        core.DummyPreemptContext(dist).should_preempt()
    with core.DummyPreemptContext(dist) as preempt:
        assert not preempt.should_preempt()
        preempt.request_preemption()
        assert preempt.should_preempt()
    ckpt = core.DummyCheckpointContext(dist, tmp_path / "store")
    (tmp_path / "store").mkdir()
    with ckpt.store_path({"steps_completed": 1}) as (path, storage_id):
        (path / "f").write_text("x")
    assert ckpt.get_metadata(storage_id) == {"steps_completed": 1}
    lengths = []
    for op in core.DummySearcherContext(dist, length=4).operations():
        lengths.append(op.length)
        op.report_completed(0.5)
    assert lengths == [4]
    with pytest.raises(RuntimeError, match="only be called on the chief"):
        core.DummySearcherOperation(3, is_chief=False).report_completed(1.0)
    with pytest.raises(ValueError, match="no searcher length"):
        list(core.SearcherContextMissing().operations())
    with core._dummy_init() as ctx:
        ctx.profiler.on()
        ctx.experimental.report_task_using_checkpoint("c")
        ctx.train.set_status("ok")


def test_explicit_info_without_trial_still_works(tmp_path: pathlib.Path) -> None:
    with core.init(distributed=solo(), info=make_info(trial_id=None),
                   run_dir=str(tmp_path / "r")) as ctx:
        ctx.train.set_metadata({"k": "v"})
        assert ctx.train.get_metadata() == {"k": "v"}
