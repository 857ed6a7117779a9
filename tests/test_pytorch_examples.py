"""examples/pytorch runs as the README says: the Trainer script (and its resume
by rerunning), the legacy runner's --test, and the legacy runner under
det-launch with 2 gloo ranks, whose checkpoint then loads with
load_trial_from_checkpoint_path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from determined_launch import pytorch
from determined_launch.core._rundir import read_jsonl
from tests.conftest import MARKER, Launch, base_env

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pytorch"


class _LaunchIn(Launch):
    """``Launch`` in a given working directory (the runner imports model_def from it)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.marker = uuid.uuid4().hex
        self.proc = subprocess.Popen(
            argv,
            env={**env, MARKER: self.marker},
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout = ""
        self.stderr = ""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the example directory: runs write det_runs/ into their cwd."""
    work = tmp_path / "mnist"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("det_runs", "__pycache__"))
    return work


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=base_env(), capture_output=True, text=True, timeout=180)


def _steps(work: Path, stream: str) -> list[int]:
    return [
        r["steps_completed"] for r in read_jsonl(work / "det_runs" / "local" / f"{stream}.jsonl")
    ]


def test_trainer_script_trains_and_resumes(workdir: Path) -> None:
    """Upstream's first way: bare, Determined's local mode reads ./const.yaml."""
    (workdir / "const.yaml").write_text((workdir / "const.yaml").read_text().replace(
        "n_filters2: 16", "n_filters2: 4"))
    r = _run([sys.executable, "train.py", "--batches", "30"], workdir)
    assert r.returncode == 0, r.stderr[-3000:]
    vals = read_jsonl(workdir / "det_runs" / "local" / "validation.jsonl")
    assert [v["steps_completed"] for v in vals] == [30]
    assert vals[-1]["metrics"]["accuracy"] > 0.3  # chance is 0.1
    (ckpt,) = (workdir / "det_runs" / "checkpoints").glob("*/load_data.json")
    assert json.loads(ckpt.read_text())["hparams"]["n_filters2"] == 4  # from const.yaml
    # The same command with a longer length continues from batch 30 ("latest").
    r = _run([sys.executable, "train.py", "--batches", "40"], workdir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _steps(workdir, "validation") == [30, 40]
    assert _steps(workdir, "training") == [30, 40]


def _small(work: Path) -> None:
    """A smaller dataset, so that launcher runs stay short."""
    train = work / "train.py"
    text = train.read_text()
    assert '"train_size": 6000, "val_size": 1000' in text
    train.write_text(text.replace('"train_size": 6000, "val_size": 1000',
                                  '"train_size": 640, "val_size": 64'))


@pytest.mark.slow
def test_trainer_script_under_det_launch_torch_with_config(workdir: Path) -> None:
    """Upstream's second way: on two ranks, the trial's hparams from --config."""
    _small(workdir)
    cmd = [sys.executable, "-m", "determined_launch.cli", "--slots", "2", "--config", "const.yaml",
           "torch", "--", sys.executable, "train.py", "--batches", "10"]
    r = _run(cmd, workdir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _steps(workdir, "validation") == [10]
    # Without --config nothing gave the trial hyperparameters: one line names the fix.
    shutil.rmtree(workdir / "det_runs")
    r = _run([sys.executable, "-m", "determined_launch.cli", "exec", "--", sys.executable,
              "train.py", "--batches", "1"], workdir)
    assert r.returncode == 1
    assert ("MissingHParamError: hyperparameter 'n_filters1': this trial has no "
            "hyperparameters") in r.stderr and "--config const.yaml" in r.stderr


@pytest.mark.slow
def test_trainer_script_as_the_experiment_entrypoint(workdir: Path) -> None:
    """Upstream's third way: ``det-launch experiment const.yaml`` runs its entrypoint."""
    _small(workdir)
    config = (workdir / "const.yaml").read_text()
    assert "entrypoint: python3 train.py --batches 300" in config
    # Under a searcher the config's searcher.max_length wins over fit(max_length=) (seed 002).
    (workdir / "const.yaml").write_text(config.replace("--batches 300", "--batches 7").replace(
        "max_length:\n    batches: 300", "max_length:\n    batches: 10"))
    r = _run([sys.executable, "-m", "determined_launch.cli", "experiment", "const.yaml"], workdir)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    exp = workdir / "det_experiments" / "mnist_pytorch_const"
    (trial,) = (exp / "trials").iterdir()
    assert [v["steps_completed"] for v in read_jsonl(trial / "validation.jsonl")] == [10]
    best = json.loads((exp / "best_trial.json").read_text())
    assert best["hparams"]["n_filters2"] == 16  # the config's, not a default


def test_legacy_runner_test_mode(workdir: Path) -> None:
    r = _run(
        [
            sys.executable,
            "-m",
            "determined_launch.pytorch",
            "--config",
            "const.yaml",
            "--test",
            "model_def:MNistTrial",
        ],
        workdir,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert _steps(workdir, "validation") == [1]
    (load_data,) = (workdir / "det_runs" / "checkpoints").glob("*/load_data.json")
    data = json.loads(load_data.read_text())
    assert "is_trainer" not in data and data["trial_cls_spec"] == "model_def:MNistTrial"
    assert data["hparams"]["global_batch_size"] == 64


@pytest.mark.slow
def test_legacy_runner_two_ranks_then_load(workdir: Path, launches: list[Launch]) -> None:
    config = (workdir / "const.yaml").read_text()
    config = config.replace("batches: 300", "batches: 20").replace("batches: 100", "batches: 10")
    (workdir / "small.yaml").write_text(config)
    launch = _LaunchIn(
        [
            sys.executable,
            "-m",
            "determined_launch.cli",
            "--slots",
            "2",
            "torch",
            "--",
            sys.executable,
            "-m",
            "determined_launch.pytorch",
            "--config",
            "small.yaml",
            "model_def:MNistTrial",
        ],
        base_env(),
        workdir,
    )
    launches.append(launch)
    assert launch.wait(180) == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    assert _steps(workdir, "validation") == [10, 20]
    pointer = json.loads((workdir / "det_runs" / "local" / "latest_checkpoint.json").read_text())
    ckpt = workdir / "det_runs" / "checkpoints" / pointer["storage_id"]
    saved = torch.load(ckpt / "state_dict.pth")  # default weights_only=True (FIX-3)
    assert not any(k.startswith("module.") for k in saved["models_state_dict"][0])  # FIX-4
    trial = pytorch.load_trial_from_checkpoint_path(str(ckpt))
    assert type(trial).__name__ == "MNistTrial"
    assert trial.context.get_hparam("n_filters2") == 16
    for key, value in trial.model.state_dict().items():
        assert torch.equal(value, saved["models_state_dict"][0][key])
    sys.modules.pop("model_def", None)
    sys.modules.pop("data", None)
    assert not launch.leftovers()


@pytest.mark.slow
def test_legacy_runner_preempted_exits_75_and_rerun_resumes(
    workdir: Path, launches: list[Launch]
) -> None:
    """A preemption request to the launcher stops the legacy runner with a checkpoint
    and status 75; the same command (here with a nearer max_length) resumes there."""
    import signal

    from determined_launch.errors import EXIT_PREEMPTED

    config = (workdir / "const.yaml").read_text()
    long = config.replace("batches: 300", "batches: 5000").replace(
        "scheduling_unit: 50", "scheduling_unit: 5"
    )
    (workdir / "long.yaml").write_text(long)
    cmd = [
        sys.executable,
        "-m",
        "determined_launch.cli",
        "--slots",
        "1",
        "torch",
        "--",
        sys.executable,
        "-m",
        "determined_launch.pytorch",
        "--config",
        "long.yaml",
        "model_def:MNistTrial",
    ]
    first = _LaunchIn(cmd, base_env(), workdir)
    launches.append(first)
    assert first.proc.stderr is not None
    seen = ""
    while "training: batches=" not in seen:  # training is under way (the Trainer's report line)
        line = first.proc.stderr.readline()
        assert line, seen[-3000:]
        seen += line
    first.send_signal(signal.SIGUSR1)
    assert first.wait(120) == EXIT_PREEMPTED, first.stdout[-2000:] + first.stderr[-3000:]
    pointer = json.loads((workdir / "det_runs" / "local" / "latest_checkpoint.json").read_text())
    stopped = int(pointer["metadata"]["steps_completed"])
    assert 5 <= stopped < 5000

    short = long.replace("batches: 5000", f"batches: {stopped + 5}")
    (workdir / "long.yaml").write_text(short)
    second = _LaunchIn(cmd, base_env(), workdir)
    launches.append(second)
    assert second.wait(120) == 0, second.stdout[-2000:] + second.stderr[-3000:]
    steps = _steps(workdir, "training")
    assert steps[-1] == stopped + 5 and steps.count(stopped + 5) == 1
    assert not second.leftovers()
