"""AMP: on CPU it is disabled (exact fp32, see test_pytorch_trainer.py); on a
CUDA machine the auto mode autocasts, scales and keeps the scaler in checkpoints."""

from __future__ import annotations

import math
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
    # The scaler starts at 2**16: the first gradient (-2) scaled overflows
    # fp16, so that step is skipped and the scale halved, until it fits. Skips
    # come first (gradients only shrink), then every step applies.
    scale = ctx._scaler.get_scale()
    skipped = round(math.log2(2.0**16 / scale))
    weights = [m["w_after"] for m in batch_metrics(tmp_path)]
    assert len(weights) == 8 and 0 < skipped < 8, (skipped, weights)
    expected = [0.0] * skipped + [expected_weight(k) for k in range(1, 9 - skipped)]
    assert weights == pytest.approx(expected, abs=1e-3)
    state = torch.load(next(iter(checkpoints(tmp_path).values())) / "state_dict.pth",
                       weights_only=True)
    assert state["scaler_state_dict"]["scale"] == scale
    trial2, _ = run_trial(tmp_path, AutoAmp, max_length=pytorch.Batch(8),
                          latest_checkpoint="latest")
    assert trial2.context._scaler.get_scale() == scale
