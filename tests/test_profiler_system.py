"""System metrics (issue 36 §4): GPU rows from NVML, the sampler without it,
MLflow's system metrics through --report-to."""

from __future__ import annotations

import json
import logging
import pathlib
import threading
import time
import types
from typing import Any

import pytest

from determined_launch.core import _profiler
from determined_launch.core._profiler import ProfilerContext, gpu_sample
from determined_launch.core._rundir import read_jsonl
from determined_launch.core.trackers._system import mlflow_names
from tests.test_core_api import make_context, solo


def _fake_nvml(failing: int = -1) -> Any:
    """A stand-in for pynvml's module, for the pure shaping of one sample."""
    def rates(handle: int) -> Any:
        if handle == failing:
            raise RuntimeError("GPU is lost")
        return types.SimpleNamespace(gpu=40 + handle, memory=5)

    def memory(handle: int) -> Any:
        return types.SimpleNamespace(used=2 * 1024**3, total=8 * 1024**3, free=6 * 1024**3)

    return types.SimpleNamespace(nvmlDeviceGetUtilizationRates=rates,
                                 nvmlDeviceGetMemoryInfo=memory)


def test_gpu_rows_per_device_and_a_lost_gpu_is_left_out() -> None:
    assert gpu_sample(_fake_nvml(), [0, 1]) == {
        "gpu_util_0": 40.0, "gpu_memory_used_0": 2.0, "gpu_memory_percent_0": 25.0,
        "gpu_util_1": 41.0, "gpu_memory_used_1": 2.0, "gpu_memory_percent_1": 25.0}
    assert set(gpu_sample(_fake_nvml(failing=0), [0, 1])) == {
        "gpu_util_1", "gpu_memory_used_1", "gpu_memory_percent_1"}
    averaged = _profiler._average([
        {"cpu": {"cpu_util_simple": 10.0}, "gpu": {"gpu_util_0": 20.0}},
        {"cpu": {"cpu_util_simple": 30.0}, "gpu": {"gpu_util_0": 60.0}}])
    assert averaged["gpu"] == {"gpu_util_0": 40.0} and averaged["cpu"]["cpu_util_simple"] == 20


def test_mlflow_names_are_mlflows_own() -> None:
    record = {"cpu": {"cpu_util_simple": 12.5}, "memory": {"memory_percent": 50.0,
                                                           "free_memory": 3.0},
              "disk": {"disk_iops": 9.0},
              "gpu": {"gpu_util_1": 80.0, "gpu_memory_used_1": 1.0,
                      "gpu_memory_percent_1": 12.5, "gpu_util_x": 1.0}}
    assert mlflow_names(record) == {
        "system/cpu_utilization_percentage": 12.5,
        "system/system_memory_usage_percentage": 50.0,
        "system/gpu_1_utilization_percentage": 80.0,
        "system/gpu_1_memory_usage_megabytes": pytest.approx(1073.741824),
        "system/gpu_1_memory_usage_percentage": 12.5}
    assert mlflow_names({"cpu": "junk"}) == {}


def test_the_sampler_without_nvml_reports_no_gpu_group_and_says_why_at_debug(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    if _profiler.open_nvml() is not None:
        pytest.skip("this machine has a GPU: scripts/gpu_check_nvml.py covers it")
    caplog.set_level(logging.DEBUG, logger="determined_launch.core")
    caplog.clear()  # the check above may have said it already
    seen: list[dict[str, Any]] = []
    with make_context(tmp_path, solo()) as ctx:
        profiler = ProfilerContext(ctx.distributed, ctx.profiler._run_dir,
                                   on_report=seen.append)
        profiler.on(sampling_interval=0.1, samples_per_report=2)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        profiler.off()
    (record, *_) = read_jsonl(tmp_path / "run" / "profiler.jsonl")
    assert seen and "gpu" not in seen[0] and "gpu" not in record
    assert 0 <= record["memory"]["memory_percent"] <= 100
    lines = [r.getMessage() for r in caplog.records if "no GPU metrics" in r.getMessage()]
    assert len(lines) == 1 and all(r.levelno == logging.DEBUG for r in caplog.records
                                   if "no GPU metrics" in r.getMessage())
    assert not any(t.name == "det-profiler" for t in threading.enumerate())


def test_system_metrics_reach_mlflows_store(tmp_path: pathlib.Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    tracking = pytest.importorskip("mlflow.tracking")
    from determined_launch.core import trackers

    # MLflow 3 refuses new file stores: its default SQLite one, no server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    who = trackers.identity(tmp_path / "run", None, {})
    opened = trackers.open_trackers(["mlflow"], who, resuming=False)
    assert opened is not None
    for i in range(3):
        opened.system({"time": 1000.0 + i, "cpu": {"cpu_util_simple": 10.0 * i},
                       "gpu": {"gpu_util_0": 50.0}})
    opened.close("completed")
    run_id = json.loads((tmp_path / "run" / trackers.STATE_FILE).read_text())["mlflow"]["run_id"]
    client = tracking.MlflowClient()
    history = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert [(m.step, m.value, m.timestamp) for m in history] == [
        (0, 0.0, 1000000), (1, 10.0, 1001000), (2, 20.0, 1002000)]
    assert client.get_run(run_id).data.metrics["system/gpu_0_utilization_percentage"] == 50.0


@pytest.mark.parametrize("enabled", [None, False])
def test_the_trainer_samples_by_default_and_false_turns_it_off(
        tmp_path: pathlib.Path, enabled: Any) -> None:
    pytest.importorskip("torch")
    from determined_launch import pytorch
    from tests._pytorch_helpers import run_trial
    from tests.pytorch_fixtures.onevar import OneVarTrial

    sampling: list[bool] = []

    class Watched(OneVarTrial):
        def train_batch(self, *args: Any, **kwargs: Any) -> Any:
            sampling.append(self.context._core.profiler._thread is not None)
            return super().train_batch(*args, **kwargs)

    fit = {} if enabled is None else {"profiling_enabled": enabled}
    run_trial(tmp_path, Watched, max_length=pytorch.Batch(3), **fit)
    assert sampling == [enabled is None] * 3
    assert not any(t.name == "det-profiler" for t in threading.enumerate())
