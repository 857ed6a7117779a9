"""AMP: on CPU it is disabled (exact fp32, see test_pytorch_trainer.py); on a
CUDA machine the auto mode autocasts, scales and keeps the scaler in checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from determined_launch import pytorch
from tests._pytorch_helpers import batch_metrics, checkpoints, run_trial
from tests.pytorch_fixtures.onevar import OneVarTrial, expected_weight

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class AutoAmp(OneVarTrial):
    def __init__(self, context: Any, **options: Any) -> None:
        context.experimental.use_amp()
        super().__init__(context, **options)


def test_auto_amp_on_cuda_trains_and_checkpoints_the_scaler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    trial, _ = run_trial(tmp_path, AutoAmp, max_length=pytorch.Batch(8))
    ctx = trial.context
    assert ctx.device.type == "cuda" and ctx._scaler.is_enabled()
    for n, m in enumerate(batch_metrics(tmp_path)):
        assert m["w_after"] == pytest.approx(expected_weight(n + 1), abs=1e-3)
    scale = ctx._scaler.get_scale()
    state = torch.load(next(iter(checkpoints(tmp_path).values())) / "state_dict.pth",
                       weights_only=True)
    assert state["scaler_state_dict"]["scale"] == scale
    trial2, _ = run_trial(tmp_path, AutoAmp, max_length=pytorch.Batch(8),
                          latest_checkpoint="latest")
    assert trial2.context._scaler.get_scale() == scale
