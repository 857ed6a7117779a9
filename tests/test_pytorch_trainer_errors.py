"""Bad input to det.pytorch: clear exceptions naming the mistake, never asserts
from our code (except where upstream's API raises AssertionError)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import determined_launch as det
from determined_launch import pytorch
from determined_launch.errors import InternalException, InvalidExperimentException
from tests._pytorch_helpers import batch_metrics, run_trial
from tests.pytorch_fixtures.onevar import HPARAMS, OneVarTrial, PairsDataset


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def ctx(tmp_path: Path) -> Any:
    with pytorch.init(hparams=dict(HPARAMS), seed=1, run_dir=str(tmp_path / "run"),
                      checkpoint_storage=str(tmp_path / "ckpt")) as c:
        yield c


def test_both_or_neither_evaluate_method(ctx: Any) -> None:
    class Both(OneVarTrial):
        def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
            return {}

    class Neither(OneVarTrial):
        evaluate_batch = pytorch.PyTorchTrial.evaluate_batch  # type: ignore[assignment]

    for cls in (Both, Neither):
        with pytest.raises(InvalidExperimentException, match="exactly one of"):
            pytorch.Trainer(cls(ctx), ctx).fit(max_length=pytorch.Batch(1))


def test_unwrapped_model_or_optimizer(ctx: Any) -> None:
    class NoModel(OneVarTrial):
        def __init__(self, context: Any) -> None:
            super().__init__(context)
            context.models.clear()

    with pytest.raises(InvalidExperimentException, match="wrap_model"):
        pytorch.Trainer(NoModel(ctx), ctx).fit(max_length=pytorch.Batch(1))


def test_batch_size_errors(tmp_path: Path) -> None:
    with pytorch.init(run_dir=str(tmp_path / "r")) as c:
        with pytest.raises(ValueError, match="global_batch_size"):
            c.get_per_slot_batch_size()
        with pytest.raises(ValueError, match="hparams"):
            c.get_hparam("x")
    with pytest.raises(InvalidExperimentException, match="must be an integer"):
        with pytorch.init(hparams={"global_batch_size": "4"}, run_dir=str(tmp_path / "r")):
            pass
    with pytest.raises(InvalidExperimentException, match="smaller than the number of slots"):
        with pytorch.init(hparams={"global_batch_size": 0}, run_dir=str(tmp_path / "r")):
            pass


def test_fit_argument_errors(ctx: Any, tmp_path: Path) -> None:
    trainer = pytorch.Trainer(OneVarTrial(ctx), ctx)
    with pytest.raises(ValueError, match="max_length must be defined"):
        trainer.fit()
    with pytest.raises(TypeError, match="max_length"):
        trainer.fit(max_length=pytorch.Batch([5, 10]))
    with pytest.raises(TypeError, match="max_length"):
        trainer.fit(max_length=10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="validation_period"):
        trainer.fit(max_length=pytorch.Batch(1), validation_period=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="checkpoint_policy"):
        trainer.fit(max_length=pytorch.Batch(1), checkpoint_policy="some")
    not_ckpt = tmp_path / "empty"
    not_ckpt.mkdir()
    with pytest.raises(det.errors.InvalidCheckpointException, match="state_dict.pth"):
        trainer.fit(max_length=pytorch.Batch(1), latest_checkpoint=str(not_ckpt))


def test_incompatible_checkpoint(tmp_path: Path) -> None:
    run_trial(tmp_path, max_length=pytorch.Batch(1))

    class Wider(OneVarTrial):
        def __init__(self, context: Any) -> None:
            super().__init__(context)
            context.models[0] = context.wrap_model(torch.nn.Linear(2, 1, bias=False))
            context.models.pop()

    with pytest.raises(RuntimeError, match="size mismatch"):
        run_trial(tmp_path, Wider, max_length=pytorch.Batch(2), latest_checkpoint="latest")


def test_empty_training_loader(tmp_path: Path) -> None:
    class Empty(OneVarTrial):
        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(PairsDataset(0), batch_size=4)

    with pytest.raises(ValueError, match="training data loader is empty"):
        run_trial(tmp_path, Empty, max_length=pytorch.Batch(1))


def test_plain_torch_loader_needs_opt_in(tmp_path: Path) -> None:
    class Plain(OneVarTrial):
        def build_training_data_loader(self) -> Any:
            return torch.utils.data.DataLoader(PairsDataset(8), batch_size=4)

    with pytest.raises(RuntimeError, match="disable_dataset_reproducibility_checks"):
        run_trial(tmp_path, Plain, max_length=pytorch.Batch(1))


def test_context_state_errors(ctx: Any) -> None:
    with pytest.raises(InternalException, match="Training hasn't started"):
        ctx.is_epoch_start()
    with pytest.raises(InternalException, match="Training hasn't started"):
        ctx.current_train_batch()
    with pytest.raises(AssertionError):
        ctx.set_stop_requested("yes")
    model = ctx.wrap_model(torch.nn.Linear(1, 1))
    with pytest.raises(InvalidExperimentException, match="before wrap_model"):
        ctx.wrap_scaler(torch.amp.GradScaler("cuda", enabled=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    with pytest.raises(InvalidExperimentException, match="wrap_optimizer"):
        ctx.wrap_lr_scheduler(sched, pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
    opt = ctx.wrap_optimizer(opt)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(InvalidExperimentException, match="MANUAL_STEP"):
        ctx.wrap_lr_scheduler(plateau, pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
    with pytest.raises(InvalidExperimentException, match="backward_passes_per_step"):
        ctx.wrap_optimizer(opt, backward_passes_per_step=0)
    # Without a GPU AMP cannot run at all; with one, apex is what is missing.
    apex = "needs NVIDIA apex" if torch.cuda.is_available() else "supported only on GPU"
    with pytest.raises(InvalidExperimentException, match=apex):
        with pytest.warns(FutureWarning):
            ctx.configure_apex_amp(model, opt)


def test_auto_zero_grads_false_with_aggregation(tmp_path: Path) -> None:
    class NoZero(OneVarTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            data, label = batch
            loss = self.loss_fn(self.model(data), label)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt, auto_zero_grads=False)
            return loss

    with pytest.raises(InvalidExperimentException, match="auto_zero_grads"):
        run_trial(tmp_path, NoZero, aggregation_frequency=2, max_length=pytorch.Batch(2))


# --------------------------------------------------------------------------- seed 002


def test_seed002_plain_init_build_trial_and_train(tmp_path: Path) -> None:
    ctx = pytorch.init(hparams=dict(HPARAMS), seed=1, run_dir=str(tmp_path / "run"),
                       checkpoint_storage=str(tmp_path / "ckpt"))
    try:
        assert ctx.get_global_batch_size() == 4  # proxies without `with`
        assert ctx.training.hparams["learning_rate"] == 0.5
        assert ctx.distributed.shard_batch_size(8) == 8
        trial = ctx.build_trial(OneVarTrial)
        loader = pytorch.DataLoader(PairsDataset(16), batch_size=4)
        metrics = ctx.train(trial, loader, loader, min_validation_period=det.Batches(2),
                            max_length=det.Epochs(1))
    finally:
        ctx.close()
    assert metrics is not None and metrics["batches"] == 4
    assert metrics["val_loss"] == pytest.approx(0.998 ** 8, abs=1e-6)
    assert len(batch_metrics(tmp_path)) == 4


class Seed002Trial(pytorch.PyTorchTrial):
    """Seed 002's example trial: no build_*_data_loader, the loaders go to train()."""

    def __init__(self, context: Any) -> None:
        self.context = context
        model = torch.nn.Linear(1, 1, bias=False)
        model.weight.data.fill_(0.0)
        self.model = context.wrap_model(model)
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.001))

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        data, labels = batch
        loss = torch.nn.MSELoss()(self.model(data), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        data, labels = batch
        return {"val_loss": torch.nn.MSELoss()(self.model(data), labels)}


def test_seed002_trial_without_data_loader_methods(tmp_path: Path) -> None:
    ctx = pytorch.init(hparams=dict(HPARAMS), seed=1, run_dir=str(tmp_path / "run"),
                       checkpoint_storage=str(tmp_path / "ckpt"))
    try:
        trial = ctx.build_trial(Seed002Trial)
        assert isinstance(trial, Seed002Trial) and type(trial).__name__ == "Seed002Trial"
        with pytest.raises(TypeError, match=r"no build_training_data_loader\(\): pass"):
            pytorch.Trainer(trial, ctx).fit(max_length=det.Batches(1))
        loader = pytorch.DataLoader(PairsDataset(16), batch_size=4)
        metrics = ctx.train(trial, loader, loader, min_validation_period=det.Epochs(1),
                            min_checkpoint_period=det.Epochs(1), max_length=det.Epochs(2))
        assert metrics is not None and metrics["val_loss"] == pytest.approx(0.998 ** 16, abs=1e-6)
        loaded = ctx.load_checkpoint_trial(Seed002Trial)  # restores without data too
    finally:
        ctx.close()
    assert float(loaded.model.weight.data[0, 0]) == pytest.approx(1 - 0.998**8, abs=1e-6)
    with pytest.raises(TypeError, match="build_validation_data_loader"):
        Seed002Trial(ctx)  # abstract outside build_trial, as upstream


def test_seed002_load_checkpoint_trial_and_predict(tmp_path: Path) -> None:
    with pytorch.init(hparams=dict(HPARAMS), seed=1, run_dir=str(tmp_path / "run"),
                      checkpoint_storage=str(tmp_path / "ckpt")) as ctx:
        with pytest.raises(ValueError, match="no checkpoint yet"):
            ctx.load_checkpoint_trial(OneVarTrial)
        trial = ctx.build_trial(OneVarTrial)
        pytorch.Trainer(trial, ctx).fit(max_length=pytorch.Batch(3))
        loaded = ctx.load_checkpoint_trial(OneVarTrial)
        w = float(loaded.model.weight.data[0, 0])
        assert w == pytest.approx(1 - 0.998**3, abs=1e-7)
        loader = pytorch.DataLoader(PairsDataset(8), batch_size=4)
        outs = ctx.predict(trial, loader)
    assert len(outs) == 2 and outs[0]["weight"] == pytest.approx(w)


def test_more_local_ranks_than_gpus_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_launch.pytorch.api.context import local_gpu

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [local_gpu(r, 2) for r in (0, 1)] == [0, 1]
    with pytest.raises(InvalidExperimentException,
                       match=r"local rank 2 has no GPU of its own: 3 ranks on this node but "
                             r"2 visible GPU\(s\); start one rank per GPU"):
        local_gpu(2, 3)
