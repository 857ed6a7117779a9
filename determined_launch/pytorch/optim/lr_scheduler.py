"""``LRScheduler``: a torch LR scheduler plus when the training loop steps it.

Stepping depends only on the batch index, the aggregation frequency and the
epoch length (never on reporting or validation boundaries), so a resumed run
steps exactly as an uninterrupted one.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, List


class LRScheduler:
    """Wraps ``torch.optim.lr_scheduler`` objects for ``context.wrap_lr_scheduler``.

    ``STEP_EVERY_BATCH``: after every batch (``frequency`` N: every N batches);
    with gradient aggregation the steps of the aggregated batches happen at the
    optimizer step. ``STEP_EVERY_OPTIMIZER_STEP``: at optimizer steps whose
    batch number is a multiple of ``frequency`` (upstream's rule; equal to
    "every N optimizer steps" when aggregation is 1). ``STEP_EVERY_EPOCH``: when
    the next optimizer step lands in the next epoch (every ``frequency``
    epochs). ``MANUAL_STEP``: never; the trial calls ``step()``.
    """

    class StepMode(enum.Enum):
        STEP_EVERY_EPOCH = 1
        STEP_EVERY_BATCH = 2
        MANUAL_STEP = 3
        STEP_EVERY_OPTIMIZER_STEP = 4

    def __init__(self, scheduler: Any, step_mode: StepMode, frequency: int = 1) -> None:
        if not isinstance(step_mode, LRScheduler.StepMode):
            raise TypeError(
                f"step_mode must be an LRScheduler.StepMode. Got {type(step_mode)} "
                f"({step_mode!r}); e.g. LRScheduler.StepMode.STEP_EVERY_BATCH"
            )
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
            raise ValueError(f"frequency must be an int >= 1, got {frequency!r}")
        self._scheduler = scheduler
        self._step_mode = step_mode
        self._frequency = frequency

    @property
    def scheduler(self) -> Any:
        return self._scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        self._scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> List:
        return list(self._scheduler.get_last_lr())

    def load_state_dict(self, state_dict: Dict[Any, Any]) -> None:
        self._scheduler.load_state_dict(state_dict)

    def state_dict(self) -> Dict[Any, Any]:
        return dict(self._scheduler.state_dict())

    def _steps_due(self, batch_idx: int, aggregation_frequency: int, epoch_len: int) -> int:
        return lr_steps_due(
            self._step_mode, self._frequency, batch_idx, aggregation_frequency, epoch_len
        )

    def _auto_step(self, batch_idx: int, aggregation_frequency: int, epoch_len: int) -> int:
        """Step as the loop does after batch ``batch_idx``; returns the number of steps."""
        n = self._steps_due(batch_idx, aggregation_frequency, epoch_len)
        for _ in range(n):
            self._scheduler.step()
        return n


def lr_steps_due(
    step_mode: LRScheduler.StepMode,
    frequency: int,
    batch_idx: int,
    aggregation_frequency: int,
    epoch_len: int,
) -> int:
    """How many times to step the scheduler after batch ``batch_idx`` (0-based, global).

    Zero unless the batch is an optimizer step, i.e. ``(batch_idx + 1) %
    aggregation_frequency == 0``.
    """
    if aggregation_frequency < 1:
        raise ValueError(f"aggregation_frequency must be >= 1, got {aggregation_frequency}")
    if (batch_idx + 1) % aggregation_frequency != 0:
        return 0
    if step_mode is LRScheduler.StepMode.STEP_EVERY_BATCH:
        first = batch_idx - aggregation_frequency + 1
        return sum(1 for i in range(first, batch_idx + 1) if (i + 1) % frequency == 0)
    if step_mode is LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP:
        return 1 if (batch_idx + 1) % frequency == 0 else 0
    if step_mode is LRScheduler.StepMode.STEP_EVERY_EPOCH:
        if epoch_len < 1:
            raise ValueError(f"epoch_len must be >= 1, got {epoch_len}")
        this_epoch = batch_idx // epoch_len
        next_step_epoch = (batch_idx + aggregation_frequency) // epoch_len
        return sum(1 for e in range(this_epoch, next_step_epoch) if (e + 1) % frequency == 0)
    return 0  # MANUAL_STEP
