"""The seeds as written (issue 33 §3, §2.4, §2.10): the Trainer proposal's
(seed 002) trial and batch-inference shapes, the blog post's (seed 004)
``latest_batch=``, the searcher's max_length under a trial, and one log line
per Trainer report."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import determined_launch as det
from determined_launch import core, pytorch
from tests._pytorch_helpers import reports, run_trial
from tests.conftest import base_env
from tests.pytorch_fixtures.onevar import HPARAMS

HP = {"learning_rate": 0.1, "global_batch_size": 8}


class OnesDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.Tensor([1.0]), torch.Tensor([1.0])


class SeedTrial(pytorch.PyTorchTrial):
    """Seed 002's OneVarPytorchTrial (its model called on the data, not the pair)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(1, 1, False))
        lr = context.hparams["learning_rate"]
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=lr))

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        data, labels = batch
        loss = torch.nn.MSELoss()(self.model(data), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: pytorch.TorchData) -> dict[str, Any]:  # type: ignore[override]
        data, labels = batch
        return {"loss": torch.nn.MSELoss()(self.model(data), labels)}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ("DET_CLUSTER_INFO_FILE", "DET_LAUNCH_CONFIG", "DET_SEARCHER_UNIT"):
        monkeypatch.delenv(var, raising=False)


def _init(tmp_path: Path, **kwargs: Any) -> Any:
    return pytorch.init(seed=1, run_dir=str(tmp_path / "run"),
                        checkpoint_storage=str(tmp_path / "ckpt"), **kwargs)


def test_seed002_training_and_batch_inference_shapes(tmp_path: Path) -> None:
    ctx = _init(tmp_path, hparams=dict(HP))
    assert ctx.training.hparams["global_batch_size"] == 8
    size = ctx.distributed.shard_batch_size(ctx.training.hparams["global_batch_size"])
    trial = ctx.build_trial(SeedTrial)
    assert trial.context.hparams == HP  # the trial's context (AttributeError before)
    metrics = ctx.train(trial, pytorch.DataLoader(OnesDataset(), size),
                        pytorch.DataLoader(OnesDataset(), size),
                        min_validation_period=det.Epochs(1), max_length=det.Epochs(2))
    assert metrics is not None and "loss" in metrics
    # evaluate_batch(self, batch): one argument (TypeError: batch_idx before)
    out = ctx.predict(trial, pytorch.DataLoader(OnesDataset(), batch_size=16))
    assert len(out) == 2 and all(set(o) == {"loss"} for o in out)
    ctx.close()


def test_config_data_from_exp_conf_and_the_config_file(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "batch_inference.yaml"
    conf.write_text("entrypoint_script: python3 batch_inference.py\n"
                    "data:\n  trial_id: 777\n  batch_size: 64\nresources:\n  slots: 8\n")
    with _init(tmp_path, hparams=dict(HP)) as ctx:
        assert ctx.config_data == {}  # no config: an empty data block, as Determined's
        monkeypatch.setenv("DET_LAUNCH_CONFIG", str(conf))
        assert ctx.config_data == {"trial_id": 777, "batch_size": 64}
        conf.write_text("data: [1, 2]\n")
        with pytest.raises(ValueError, match=r"batch_inference.yaml .*data: expected a mapping"):
            ctx.config_data  # noqa: B018
    with _init(tmp_path, hparams=dict(HP), exp_conf={"data": {"x": 1}}) as ctx:
        assert ctx.config_data == {"x": 1}  # init(exp_conf=) first


def test_bare_run_without_hyperparameters_names_the_fix(tmp_path: Path) -> None:
    code = ("from determined_launch import pytorch\n"
            "ctx = pytorch.init(seed=1)\n"
            "ctx.training.hparams['global_batch_size']\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=base_env(),
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "MissingHParamError: hyperparameter 'global_batch_size': this trial has no " \
           "hyperparameters" in last, out.stderr
    assert "det-launch --config" in last


def test_latest_batch_is_steps_completed_with_one_deprecation_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "determined_launch.core")
    with core.init(run_dir=str(tmp_path / "run"), checkpoint_storage=str(tmp_path / "c")) as cc:
        for n in (5, 10):
            cc.train.report_training_metrics(latest_batch=n, metrics={"loss": 1.0})
            cc.train.report_validation_metrics(latest_batch=n, metrics={"val_loss": 2.0})
        with pytest.raises(TypeError, match="not both"):
            cc.train.report_training_metrics(steps_completed=1, latest_batch=1, metrics={})
        with pytest.raises(TypeError, match="'metrics'"):
            cc.train.report_validation_metrics(steps_completed=1)
    assert [r["steps_completed"] for r in reports(tmp_path, "training")] == [5, 10]
    assert [r["steps_completed"] for r in reports(tmp_path, "validation")] == [5, 10]
    lines = [r.getMessage() for r in caplog.records if "latest_batch" in r.getMessage()]
    assert len(lines) <= 2 and all("deprecated" in line for line in lines), lines


def _trial_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **trial: Any) -> None:
    path = tmp_path / "info.json"
    path.write_text(json.dumps({
        "container_addrs": ["127.0.0.1"], "container_rank": 0, "container_slot_counts": [1],
        "trial": {"trial_id": 3, "hparams": HPARAMS, "trial_seed": 42, **trial},
    }))
    monkeypatch.setenv("DET_CLUSTER_INFO_FILE", str(path))


def test_under_a_searcher_the_configs_max_length_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _trial_info(tmp_path, monkeypatch, max_length=2)  # searcher.max_length: {epochs: 2}
    monkeypatch.setenv("DET_SEARCHER_UNIT", "EPOCHS")
    caplog.set_level(logging.WARNING, "determined_launch.pytorch")
    _, trainer = run_trial(tmp_path, max_length=pytorch.Epoch(10))
    # 64 records, global batch 4: 16 batches an epoch; 2 epochs, not 10
    assert reports(tmp_path, "training")[-1]["steps_completed"] == 32
    said = [r.getMessage() for r in caplog.records if "max_length" in r.getMessage()]
    assert len(said) == 1 and "Epoch(10)" in said[0] and "Epoch(2)" in said[0], said


def test_one_line_per_report_and_no_best_warning_by_default(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    run_trial(tmp_path, max_length=pytorch.Batch(8), reporting_period=pytorch.Batch(4),
              validation_period=pytorch.Batch(8))
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("training: ") for m in messages) == 2
    assert sum(m.startswith("validation: ") for m in messages) == 1
    assert not [m for m in messages if "report_training_metrics()" in m
                or "report_validation_metrics()" in m], messages
    assert not [m for m in messages if "checkpoint_policy='best'" in m]
    caplog.clear()
    run_trial(tmp_path, max_length=pytorch.Batch(2), checkpoint_policy="best", run="r2")
    assert [r for r in caplog.records if "checkpoint_policy='best'" in r.getMessage()]


def test_checkpoint_metadata_names_the_packages_version(tmp_path: Path) -> None:
    _, trainer = run_trial(tmp_path, max_length=pytorch.Batch(2))
    meta = json.loads((tmp_path / "ckpt" / trainer.latest_checkpoint / "metadata.json"
                       ).read_text())
    assert meta["determined_version"] == det.__version__


def test_load_checkpoint_trial_by_the_roots_trial_id(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_launch.exproot import Root

    root = Root(tmp_path / "det_experiments")
    _, exp_dir = root.new_experiment_dir("const")
    trial_id = root.new_trial_id(exp_dir, 0)
    ctx = pytorch.init(seed=1, hparams=dict(HP), run_dir=str(exp_dir / "trials" / str(trial_id)),
                       checkpoint_storage=str(exp_dir / "checkpoints"))
    trained = ctx.build_trial(SeedTrial)
    ctx.train(trained, pytorch.DataLoader(OnesDataset(), 8), pytorch.DataLoader(OnesDataset(), 8),
              max_length=pytorch.Batch(3))
    ctx.close()
    # seed 002's batch inference: a job that loads the trial by its id
    monkeypatch.setenv("DET_EXPERIMENTS_DIR", str(root.path))
    with _init(tmp_path, hparams=dict(HP)) as job:
        loaded = job.load_checkpoint_trial(SeedTrial, trial_id=trial_id)
        assert torch.equal(loaded.model.weight, trained.model.weight)
        with pytest.raises(ValueError, match=f"trial_id={trial_id + 1}"):
            job.load_checkpoint_trial(SeedTrial, trial_id=trial_id + 1)


def test_det_launch_config_hands_its_path_to_the_workers(tmp_path: Path) -> None:
    """So that a worker's ctx.config_data reads `det-launch --config`'s data block."""
    (tmp_path / "job.yaml").write_text("data:\n  trial_id: 777\n")
    code = "import os; print('CONFIG', os.environ.get('DET_LAUNCH_CONFIG'))"
    out = subprocess.run(
        [sys.executable, "-m", "determined_launch.cli", "--config", "job.yaml", "exec", "--",
         sys.executable, "-c", code], cwd=tmp_path, env=base_env(), capture_output=True,
        text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert f"CONFIG {tmp_path / 'job.yaml'}" in out.stdout, out.stdout
