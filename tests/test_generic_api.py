"""Seed 000's Generic API (issue 23, item 2b): ``det.generic`` over the Core
API, its tutorial (examples/generic) as a random search and as a preempted,
resumed single run, and the searcher length that must not stop a trial early."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

import determined_launch as det
from determined_launch.core._rundir import read_jsonl
from determined_launch.errors import EXIT_PREEMPTED
from determined_launch.experiment.driver import past_the_end
from determined_launch.experiment.expconf import SearcherConfig
from tests.conftest import REPO, base_env

EXAMPLE = REPO / "examples" / "generic"


@pytest.fixture
def cwd(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    for var in [v for v in os.environ if v.startswith("DET_")]:
        monkeypatch.delenv(var)
    return tmp_path


class Scalar:
    """A torch/numpy-like scalar (the seed's metrics are tensors)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


def test_importing_it_never_imports_torch() -> None:
    code = ("import sys, determined_launch as det; det.generic.init; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], env=base_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_seed_calls_over_the_core_api(cwd: pathlib.Path) -> None:
    run = cwd / "det_runs" / "local"
    with det.generic.init(max_length=2) as context:
        assert context.latest_checkpoint is None
        assert context.training.trial_seed == 0
        op = context.training.basic_search()
        assert op.epochs == 2
        context.training.report_training_metrics(batches_trained=8, metrics={"loss": 1.0})
        context.training.report_validation_metrics(batches_trained=8,
                                                   metrics={"loss": Scalar(0.5)})
        op.report_progress(1)
        with context.checkpoint.save_path() as path:
            (path / "my_checkpoint").write_text("epoch 0")
        op.complete(Scalar(0.25))
        assert context.should_preempt() is False
    assert [r["steps_completed"] for r in read_jsonl(run / "validation.jsonl")] == [8]
    assert read_jsonl(run / "validation.jsonl")[0]["metrics"] == {"loss": 0.5}
    assert read_jsonl(run / "searcher.jsonl")[0]["searcher_metric"] == 0.25
    # The next run of the same local trial resumes from that checkpoint.
    with det.generic.init(max_length=2) as context:
        latest = context.latest_checkpoint
        assert latest is not None
        with latest as path:
            assert (path / "my_checkpoint").read_text() == "epoch 0"
        assert context.batches_trained == 8  # its steps_completed, for the next save
        with context.checkpoint.save_path() as path:
            pass
    pointer = json.loads((run / "latest_checkpoint.json").read_text())
    assert pointer["metadata"]["steps_completed"] == 8


def test_basic_search_without_a_length_names_the_fix(cwd: pathlib.Path) -> None:
    with det.generic.init() as context:
        with pytest.raises(RuntimeError, match="--config CONFIG.yaml"):
            context.training.basic_search()


def _searcher(**kw: object) -> SearcherConfig:
    base: dict[str, object] = dict(name="random", metric="loss", smaller_is_better=True,
                                   max_length=3, unit="epochs", time_metric=None, max_trials=2,
                                   max_concurrent_trials=1)
    base.update(kw)
    return SearcherConfig(**base)  # type: ignore[arg-type]


def test_max_length_in_another_unit_never_stops_a_trial() -> None:
    # Seed 000's script reports batches (64 a epoch) against max_length {epochs: 3}.
    assert not past_the_end(64, _searcher())
    assert not past_the_end(10**9, _searcher(unit=None))
    assert not past_the_end(10**9, _searcher(unit="batches"))
    # 0.38's time_metric + max_time: the report is the time metric itself.
    timed = _searcher(max_length=100, unit=None, time_metric="batches")
    assert (past_the_end(99, timed), past_the_end(100, timed)) == (False, True)


def _copy_example(tmp_path: pathlib.Path) -> pathlib.Path:
    work = tmp_path / "generic"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("det_*", "__pycache__"))
    return work


def _epochs(output: str) -> list[int]:
    return [int(line.split()[2].rstrip(",")) for line in output.splitlines()
            if line.startswith("after epoch") and "eval_loss" in line]


@pytest.mark.slow
def test_the_tutorial_runs_as_a_random_search(tmp_path: pathlib.Path) -> None:
    """``det-launch experiment my_config.yaml`` runs the config's
    ``entrypoint_script``; every trial trains all of max_length's epochs although
    it reports batches (the old driver stopped each after its first report)."""
    work = _copy_example(tmp_path)
    config = (work / "my_config.yaml").read_text()
    # Epochs long enough (1024+ batches) for the old driver's stop to land before the end;
    # two of them, so that stopping after the first report shows.
    small = (config.replace("epochs: 50", "epochs: 2").replace("max_trials: 10", "max_trials: 2")
             .replace("maxval: 64", "maxval: 2"))
    (work / "small.yaml").write_text(small)
    # Both trials at once: each is mostly a torch start-up, and there are 2 cores.
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "experiment", "small.yaml"],
                       cwd=work, env=base_env(DET_EXPERIMENT_CONCURRENCY="2"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    trials = sorted((work / "det_experiments" / "small" / "trials").iterdir())
    assert len(trials) == 2
    for trial in trials:
        assert len(read_jsonl(trial / "validation.jsonl")) == 2, trial
        assert len(read_jsonl(trial / "searcher.jsonl")) == 1, trial  # op.complete() ran
    best = json.loads((work / "det_experiments" / "small" / "best_trial.json").read_text())
    assert best["hparams"]["batch_size"] in (1, 2)


@pytest.mark.slow
def test_a_single_run_is_preempted_and_resumes_from_latest_checkpoint(
        tmp_path: pathlib.Path) -> None:
    """``det-launch --config const.yaml exec -- python train.py``: --config gives
    the hyperparameters and max_length; a preempted run resumes from
    ``context.latest_checkpoint`` on the next run of the same command."""
    work = _copy_example(tmp_path)
    config = (work / "const.yaml").read_text()
    (work / "const.yaml").write_text(config.replace("epochs: 50", "epochs: 4")
                                     .replace("batch_size: 32", "batch_size: 4"))
    cmd = [sys.executable, "-m", "determined_launch.cli", "--config", "const.yaml", "exec", "--",
           sys.executable, "train.py"]
    validation = work / "det_runs" / "local" / "validation.jsonl"
    first = subprocess.Popen(cmd, cwd=work, env=base_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not validation.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        first.send_signal(signal.SIGUSR1)  # a scheduler's preemption notice
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == EXIT_PREEMPTED, out[-2000:] + err[-3000:]
    done = _epochs(out)
    assert done and done == list(range(len(done))) and len(done) < 4, out
    second = subprocess.run(cmd, cwd=work, env=base_env(), capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "det-launch: trial 0: info.latest_checkpoint is " in second.stderr
    assert _epochs(second.stdout) == list(range(len(done), 4)), second.stdout
    per_epoch = 2048 // 4
    steps = [r["steps_completed"] for r in read_jsonl(validation)]
    assert steps == [per_epoch * (i + 1) for i in range(4)]


def test_launch_layer_goes_in_front_of_the_entrypoint_script(tmp_path: pathlib.Path) -> None:
    """Seed 000's distributed config (``launch_layer:`` + ``entrypoint_script:``) runs the
    script under our torch launcher; its ``bind_mounts`` gets one line saying why it is
    not needed (was: ``unknown field(s) launch_layer``)."""
    from determined_launch import expconf
    from determined_launch.experiment.command import entrypoint_command

    path = tmp_path / "my_config.yaml"
    seed = {"launch_layer": "python3 -m determined.launch.torch_distributed",
            "entrypoint_script": "python3 train.py --epochs 2",
            "searcher": {"name": "single", "metric": "x", "max_length": {"epochs": 1}},
            "bind_mounts": [{"host_path": "/my/path", "container_path": "./checkpoint_dir"}],
            "environment": {"image": "x"}}
    conf = expconf.parse(seed, path)
    assert conf.entrypoint == ("python3", "-m", "determined.launch.torch_distributed",
                               "python3", "train.py", "--epochs", "2")
    sub, args = entrypoint_command(conf.entrypoint, str(path))
    assert (sub, args[1:]) == ("torch", ["train.py", "--epochs", "2"])
    lines = expconf.ignored_lines(conf.ignored)
    assert lines[0].startswith("bind_mounts: not needed off-cluster")
    assert lines[1:] == ["ignoring Determined-only fields: environment"]
    with pytest.raises(expconf.ConfigError, match="launch_layer: needs an entrypoint_script"):
        expconf.parse({"launch_layer": "python3 -m determined.launch.horovod"}, path,
                      trial=True)
    with pytest.raises(expconf.ConfigError, match="launch_layer: expected a string or a list"):
        expconf.parse({**seed, "launch_layer": 3}, path)
