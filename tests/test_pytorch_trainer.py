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
