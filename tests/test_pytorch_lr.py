"""LRScheduler and its auto-stepping (spec 2.7, 3.6, section 7 "LR step modes")."""

from __future__ import annotations

import warnings
from typing import List

import pytest
import torch

from determined_launch import pytorch
from determined_launch.pytorch.optim.lr_scheduler import lr_steps_due

Mode = pytorch.LRScheduler.StepMode


def make(step_mode: Mode, frequency: int = 1) -> tuple:
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    # lr == the scheduler's _step_count (1 after construction), as in the upstream fixture.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda steps: steps + 1)
    return opt, pytorch.LRScheduler(sched, step_mode, frequency)


def lr_trace(step_mode: Mode, agg: int = 1, batches: int = 40, frequency: int = 1) -> List[int]:
    opt, lr = make(step_mode, frequency)
    seen = []
    for batch_idx in range(batches):
        seen.append(round(lr.get_last_lr()[0]))  # read before the auto step
        if (batch_idx + 1) % agg == 0:
            opt.step()
        lr._auto_step(batch_idx, agg, 16)
    return seen


def test_every_batch_and_every_optimizer_step_agg1() -> None:
    assert lr_trace(Mode.STEP_EVERY_BATCH) == list(range(1, 41))
    assert lr_trace(Mode.STEP_EVERY_OPTIMIZER_STEP) == list(range(1, 41))


def test_every_epoch() -> None:
    expected = [1] * 16 + [2] * 16 + [3] * 8
    assert lr_trace(Mode.STEP_EVERY_EPOCH) == expected
    assert lr_trace(Mode.STEP_EVERY_EPOCH, agg=2) == expected


def test_manual_never_steps() -> None:
    assert lr_trace(Mode.MANUAL_STEP) == [1] * 40


def test_aggregation_2() -> None:
    assert lr_trace(Mode.STEP_EVERY_BATCH, agg=2) == [v for k in range(1, 40, 2) for v in (k, k)]
    assert lr_trace(Mode.STEP_EVERY_OPTIMIZER_STEP, agg=2) == [
        v for k in range(1, 21) for v in (k, k)
    ]


def test_frequency() -> None:
    # Every 3rd batch: steps after batches 2, 5, 8, ...
    trace = lr_trace(Mode.STEP_EVERY_BATCH, batches=10, frequency=3)
    assert trace == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]
    # Every 2nd epoch of 16 batches: one step after batch 31.
    assert lr_trace(Mode.STEP_EVERY_EPOCH, frequency=2) == [1] * 32 + [2] * 8


def test_steps_due_is_pure_and_resume_safe() -> None:
    # The count depends only on (batch_idx, agg, epoch_len): a resumed run at batch k steps
    # exactly like an uninterrupted run from k on.
    full = [lr_steps_due(Mode.STEP_EVERY_BATCH, 3, i, 2, 16) for i in range(50)]
    assert full[:6] == [0, 0, 0, 1, 0, 1]  # batches 2 and 5 fall in optimizer steps 3, 5
    assert sum(full) == 50 // 3
    assert lr_steps_due(Mode.STEP_EVERY_EPOCH, 1, 14, 2, 16) == 0
    assert lr_steps_due(Mode.STEP_EVERY_EPOCH, 1, 15, 2, 16) == 1  # next step is in epoch 1
    with pytest.raises(ValueError, match="aggregation_frequency"):
        lr_steps_due(Mode.STEP_EVERY_BATCH, 1, 0, 0, 16)


def test_validation() -> None:
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    with pytest.raises(TypeError, match="step_mode must be an LRScheduler.StepMode"):
        pytorch.LRScheduler(sched, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="frequency must be an int >= 1"):
        pytorch.LRScheduler(sched, Mode.STEP_EVERY_BATCH, frequency=0)
    assert [m.value for m in Mode] == [1, 2, 3, 4]
    assert Mode.STEP_EVERY_OPTIMIZER_STEP.value == 4


def test_state_dict_round_trip_and_passthrough() -> None:
    opt, lr = make(Mode.MANUAL_STEP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scheduler stepped without optimizer.step()
        for _ in range(3):
            lr.step()
    state = lr.state_dict()
    assert lr.get_last_lr() == [4.0]
    _, other = make(Mode.MANUAL_STEP)
    other.load_state_dict(state)
    assert other.get_last_lr() == [4.0] and other.scheduler.last_epoch == 3
