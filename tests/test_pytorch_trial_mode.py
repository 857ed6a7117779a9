"""Trial mode: a cluster-info file with `trial` (as Determined's info dir
gives on a cluster). Trial identity decides resume vs warm start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from determined_launch import pytorch
from tests._pytorch_helpers import batch_metrics, checkpoints, reports, run_trial
from tests.pytorch_fixtures.onevar import HPARAMS, expected_weight


def _trial_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trial_id: int,
                **trial: Any) -> None:
    path = tmp_path / f"info-{trial_id}.json"
    path.write_text(json.dumps({
        "container_addrs": ["127.0.0.1"], "container_rank": 0, "container_slot_counts": [1],
        "trial": {"trial_id": trial_id, "hparams": HPARAMS, "trial_seed": 42, **trial},
    }))
    monkeypatch.setenv("DET_CLUSTER_INFO_FILE", str(path))


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_trial_seed_and_same_trial_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    _trial_info(tmp_path, monkeypatch, 7)
    trial, _ = run_trial(tmp_path, seed=1, max_length=pytorch.Batch(4))
    assert trial.context.get_trial_seed() == 42  # the trial's seed wins over seed=
    assert trial.context.get_trial_id() == 7
    run_trial(tmp_path, max_length=pytorch.Batch(6), latest_checkpoint="latest")
    assert [r["steps_completed"] for r in reports(tmp_path, "training")] == [4, 6]
    assert {r["trial_id"] for r in reports(tmp_path, "training")} == {7}


def test_checkpoint_of_another_trial_is_a_warm_start(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _trial_info(tmp_path, monkeypatch, 7)
    run_trial(tmp_path, max_length=pytorch.Batch(4))
    ckpt = checkpoints(tmp_path)[4]
    _trial_info(tmp_path, monkeypatch, 8)
    trial, _ = run_trial(tmp_path, run="t8", max_length=pytorch.Batch(2),
                         latest_checkpoint=ckpt.name)
    metrics = batch_metrics(tmp_path, "t8")
    # Weights continue from batch 4, counters start again at 0.
    assert len(metrics) == 2
    assert metrics[0]["w_before"] == pytest.approx(expected_weight(4), abs=1e-7)
    assert [r["steps_completed"] for r in reports(tmp_path, "training", "t8")] == [2]


def test_trial_mode_max_length_fallback_and_test_mode(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _trial_info(tmp_path, monkeypatch, 3, max_length=3)
    with pytest.warns(FutureWarning, match="max_length"):
        run_trial(tmp_path, max_length=None)
    assert len(batch_metrics(tmp_path)) == 3
    with pytest.raises(ValueError, match="test_mode is only supported in local"):
        run_trial(tmp_path, max_length=pytorch.Batch(1), test_mode=True)


def test_trial_mode_hparams_default_to_the_trials(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _trial_info(tmp_path, monkeypatch, 5)
    with pytorch.init(run_dir=str(tmp_path / "r")) as ctx:
        assert ctx.get_hparams() == HPARAMS and ctx.get_global_batch_size() == 4
