"""det.pytorch.init + Trainer.fit on the OneVar trial: the numbers of spec section 7."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from determined_launch import pytorch
from tests._pytorch_helpers import batch_metrics, reports, run_trial
from tests.pytorch_fixtures.onevar import expected_weight, triangle


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Checkpoints copy the working directory into code/: keep it small.
    monkeypatch.chdir(tmp_path)


def test_onevar_closed_form_every_batch(tmp_path: Path) -> None:
    run_trial(tmp_path, max_length=pytorch.Batch(40), reporting_period=pytorch.Batch(10))
    metrics = batch_metrics(tmp_path)
    assert len(metrics) == 40
    last = None
    for n, m in enumerate(metrics):
        assert abs(float(m["loss"]) - 0.998 ** (2 * n)) <= 1e-6
        assert abs(m["w_after"] - expected_weight(n + 1)) <= 1e-6
        assert abs(m["w_before"] - expected_weight(n)) <= 1e-6
        if last is not None:
            assert float(m["loss"]) <= last
        last = float(m["loss"])


def test_hundred_batches_metric_windows_validations_and_final_weight(tmp_path: Path) -> None:
    trial, trainer = run_trial(
        tmp_path,
        max_length=pytorch.Batch(100),
        checkpoint_period=pytorch.Batch(50),
        validation_period=pytorch.Batch(50),
    )
    train = reports(tmp_path, "training")
    assert [r["steps_completed"] for r in train] == [50, 100]
    a, b = (r["metrics"] for r in train)
    assert a["loss"] == pytest.approx(0.9080740, abs=1e-6)
    assert b["loss"] == pytest.approx(0.7433193, abs=1e-6)
    assert a["w_after"] == pytest.approx(0.0493732, abs=1e-6)
    assert b["w_after"] == pytest.approx(0.1399235, abs=1e-6)
    assert (a["batches"], a["epochs"], b["batches"], b["epochs"]) == (50, 3, 100, 6)
    assert a["cls_reducer"] == a["fn_reducer"] == triangle(4, 0, 50) == 4900
    assert b["cls_reducer"] == b["fn_reducer"] == triangle(4, 50, 100) == 14900
    val = reports(tmp_path, "validation")
    assert [r["steps_completed"] for r in val] == [50, 100]
    assert val[0]["metrics"]["val_loss"] == pytest.approx(0.8185668, abs=1e-6)
    assert val[1]["metrics"]["val_loss"] == pytest.approx(0.6700516, abs=1e-6)
    assert val[0]["metrics"]["cls_reducer"] == val[1]["metrics"]["fn_reducer"] == 480
    assert len(list((tmp_path / "ckpt").glob("*/state_dict.pth"))) == 2
    w = float(trial.model.weight.data.flatten()[0])
    assert w == pytest.approx(0.1814332, abs=1e-7)
    assert trainer.last_validation_metrics["val_loss"] == pytest.approx(0.6700516, abs=1e-6)


def test_batch_metric_types(tmp_path: Path) -> None:
    seen: list = []

    class Keep(pytorch.PyTorchCallback):
        def on_training_workload_end(self, avg_metrics, batch_metrics):  # type: ignore[no-untyped-def]
            seen.extend(batch_metrics)

    from tests.pytorch_fixtures.onevar import OneVarTrial

    class T(OneVarTrial):
        def build_callbacks(self):  # type: ignore[no-untyped-def]
            return {"keep": Keep()}

    run_trial(tmp_path, T, max_length=pytorch.Batch(2))
    m = seen[0]
    assert isinstance(m["loss"], np.ndarray) and m["loss"].shape == ()
    assert m["loss_exp"].shape == (1,) and m["w_exp"].shape == (1,)
    assert m["output"].shape == (4, 1)
    assert type(m["w_before"]) is float and type(m["w_after"]) is float


# --------------------------------------------------------------------------- FIXes


def test_seeds_always_set_fix6(tmp_path: Path) -> None:
    """Upstream seeds only on a cluster (locally get_trial_seed() raises)."""
    import torch

    draws = []
    for _ in range(2):
        with pytorch.init(seed=11, run_dir=str(tmp_path / "r")) as ctx:
            assert ctx.get_trial_seed() == 11
            draws.append(torch.rand(3).tolist())
    assert draws[0] == draws[1]
    with pytorch.init(exp_conf={"reproducibility": {"experiment_seed": 5}},
                      run_dir=str(tmp_path / "r")) as ctx:
        assert ctx.get_trial_seed() == 5
    with pytorch.init(run_dir=str(tmp_path / "r")) as ctx:
        assert 0 <= ctx.get_trial_seed() < 2**31


def test_checkpoint_records_seed_and_trial(tmp_path: Path) -> None:
    import json

    run_trial(tmp_path, max_length=pytorch.Batch(1), seed=99)
    (meta,) = (tmp_path / "ckpt").glob("*/metadata.json")
    data = json.loads(meta.read_text())
    assert data["trial_seed"] == 99 and data["steps_completed"] == 1
    assert data["framework"].startswith("torch-")


def test_preemption_polled_every_batch_fix12(tmp_path: Path) -> None:
    """A preemption request lands within a few batches, not at the reporting
    period (upstream checks only at boundaries: it would train all 200)."""
    from tests.pytorch_fixtures.onevar import OneVarTrial

    class Preempted(OneVarTrial):
        def train_batch(self, batch, epoch_idx, batch_idx):  # type: ignore[no-untyped-def]
            if batch_idx == 3:
                self.context._core.preempt.request_preemption("test")
            return super().train_batch(batch, epoch_idx, batch_idx)

    run_trial(tmp_path, Preempted, max_length=pytorch.Batch(200),
              reporting_period=pytorch.Batch(1000))
    from tests._pytorch_helpers import checkpoints

    done = len(batch_metrics(tmp_path))
    assert 4 <= done <= 10
    assert list(checkpoints(tmp_path)) == [done]
    assert reports(tmp_path, "validation") == []  # preemption: checkpoint, no validation


def test_stop_requested_stops_at_first_boundary_with_checkpoint(tmp_path: Path) -> None:
    from tests._pytorch_helpers import checkpoints
    from tests.pytorch_fixtures.onevar import OneVarTrial

    class Stop(OneVarTrial):
        def train_batch(self, batch, epoch_idx, batch_idx):  # type: ignore[no-untyped-def]
            if batch_idx == 2:
                self.context.set_stop_requested(True)
            return super().train_batch(batch, epoch_idx, batch_idx)

    run_trial(tmp_path, Stop, max_length=pytorch.Batch(50), reporting_period=pytorch.Batch(5))
    assert len(batch_metrics(tmp_path)) == 5
    assert list(checkpoints(tmp_path)) == [5]


def test_finite_custom_loader_is_reiterated_fix13(tmp_path: Path) -> None:
    import torch

    from tests.pytorch_fixtures.onevar import OneVarTrial, PairsDataset

    class Custom(OneVarTrial):
        def __init__(self, context):  # type: ignore[no-untyped-def]
            super().__init__(context)
            context.experimental.disable_dataset_reproducibility_checks()

        def build_training_data_loader(self):  # type: ignore[no-untyped-def]
            return torch.utils.data.DataLoader(PairsDataset(12), batch_size=4)

    run_trial(tmp_path, Custom, max_length=pytorch.Batch(7))
    metrics = batch_metrics(tmp_path)
    assert len(metrics) == 7
    assert metrics[-1]["w_after"] == pytest.approx(expected_weight(7), abs=1e-6)


def test_invalid_hp_checkpoints_then_propagates(tmp_path: Path) -> None:
    import determined_launch as det
    from tests._pytorch_helpers import checkpoints
    from tests.pytorch_fixtures.onevar import OneVarTrial

    class Bad(OneVarTrial):
        def train_batch(self, batch, epoch_idx, batch_idx):  # type: ignore[no-untyped-def]
            if batch_idx == 3:
                raise det.InvalidHP("lr too high")
            return super().train_batch(batch, epoch_idx, batch_idx)

    # The controller checkpoints and re-raises; the Core API context then
    # reports the early exit and ends the process with status 0, as Determined's does.
    with pytest.raises(SystemExit) as e:
        run_trial(tmp_path, Bad, max_length=pytorch.Batch(10))
    assert e.value.code == 0 and isinstance(e.value.__context__, det.InvalidHP)
    assert list(checkpoints(tmp_path)) == [3]
    assert "EXITED_REASON_INVALID_HP" in (tmp_path / "run" / "early_exit.json").read_text()


def test_nan_loss_warns_once_and_continues(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                           ) -> None:
    run_trial(tmp_path, max_length=pytorch.Batch(4), trial_kwargs={"nan_at": 1})
    warnings = [r for r in caplog.records if "loss is NaN at batch 1" in r.getMessage()]
    assert len(warnings) == 1
    assert len(batch_metrics(tmp_path)) == 4


def test_amp_on_cpu_is_disabled_and_exact(tmp_path: Path) -> None:
    import torch

    from tests.pytorch_fixtures.onevar import OneVarTrial

    if torch.cuda.is_available():
        pytest.skip("checks AMP without a GPU (with one: test_pytorch_trainer_amp.py)")

    class Amp(OneVarTrial):
        def __init__(self, context):  # type: ignore[no-untyped-def]
            context.experimental.use_amp()
            super().__init__(context)

    trial, _ = run_trial(tmp_path, Amp, max_length=pytorch.Batch(5))
    assert trial.context._scaler is not None and not trial.context._scaler.is_enabled()
    assert batch_metrics(tmp_path)[-1]["w_after"] == pytest.approx(expected_weight(5), abs=1e-7)
    (state,) = (tmp_path / "ckpt").glob("*/state_dict.pth")
    assert "scaler_state_dict" in torch.load(state, weights_only=True)


def test_gradient_clipping_sees_all_parameters(tmp_path: Path) -> None:
    import torch

    from tests.pytorch_fixtures.onevar import OneVarTrial

    class Clip(OneVarTrial):
        def train_batch(self, batch, epoch_idx, batch_idx):  # type: ignore[no-untyped-def]
            data, label = batch
            loss = self.loss_fn(self.model(data), label)
            self.context.backward(loss)
            self.context.step_optimizer(
                self.opt, clip_grads=lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.0001)
            )
            return {"loss": loss, "w": float(self.model.weight.data[0, 0])}

    run_trial(tmp_path, Clip, max_length=pytorch.Batch(3))
    # Unclipped gradient is -2; clipped to -1e-4, so w grows by 1e-7 per batch.
    assert batch_metrics(tmp_path)[-1]["w"] == pytest.approx(3e-7, rel=1e-3)


def test_best_policy_with_searcher_metric(tmp_path: Path) -> None:
    from tests._pytorch_helpers import checkpoints
    from tests.pytorch_fixtures.onevar import HPARAMS, OneVarTrial

    with pytorch.init(hparams=dict(HPARAMS), seed=1, run_dir=str(tmp_path / "run"),
                      checkpoint_storage=str(tmp_path / "ckpt"),
                      exp_conf={"searcher": {"metric": "val_loss",
                                             "smaller_is_better": False}}) as ctx:
        pytorch.Trainer(OneVarTrial(ctx), ctx).fit(
            max_length=pytorch.Batch(6), validation_period=pytorch.Batch(2),
            checkpoint_policy="best")
    # val_loss only decreases; "bigger is better" keeps the first validation's
    # checkpoint (2) and the final one (6).
    assert list(checkpoints(tmp_path)) == [2, 6]


def test_batches_between_boundaries_call_no_function_of_the_trainer(tmp_path: Path) -> None:
    """Issue 28 §1: between two model steps inside a segment (no boundary, no
    epoch end) the Trainer runs no function of determined_launch.pytorch: one
    flat loop. The layered path called BatchStep.__call__, start_batch,
    to_device, _cpu_tensors and two generators of ours after every batch."""
    import sys

    import determined_launch
    from tests.pytorch_fixtures.onevar import OneVarTrial

    root = str(Path(determined_launch.__file__).parent / "pytorch")
    after: list[int] = [-1]
    calls: list[tuple[int, str]] = []

    def profile(frame: object, event: str, arg: object) -> None:
        code = frame.f_code  # type: ignore[attr-defined]
        if event == "call" and after[0] >= 0 and code.co_filename.startswith(root):
            calls.append((after[0], code.co_name))

    class Counted(OneVarTrial):
        def train_batch(self, batch, epoch_idx, batch_idx):  # type: ignore[no-untyped-def]
            after[0] = -1
            out = super().train_batch(batch, epoch_idx, batch_idx)
            if batch_idx == 0:
                sys.setprofile(profile)
            elif batch_idx == 11:  # the segment ends here (max_length): stop counting
                sys.setprofile(None)
                return out
            after[0] = batch_idx
            return out

    try:
        run_trial(tmp_path, Counted, max_length=pytorch.Batch(12))  # 16 batches an epoch
    finally:
        sys.setprofile(None)
    assert calls == []
    assert len(batch_metrics(tmp_path)) == 12
