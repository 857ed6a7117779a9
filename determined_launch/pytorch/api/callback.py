"""``PyTorchCallback``: hooks into the training loop; every hook is a no-op by default."""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional


class PyTorchCallback:
    """Subclass and override the hooks you need; return them from
    ``PyTorchTrial.build_callbacks()`` as ``{name: callback}``.

    ``state_dict``/``load_state_dict`` let a callback keep state in
    checkpoints (saved under its name).
    """

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """Once, before training; ``first_batch_idx`` is the resume offset."""

    def on_trial_shutdown(self) -> None:
        """Once, when the trial ends (also after an exception)."""

    def on_training_start(self) -> None:
        """Once, before the first training batch."""

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        """Before the first batch of each epoch. (A legacy zero-argument override still works.)"""

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        """After the last batch of each epoch."""

    def on_training_workload_end(
        self, avg_metrics: Dict[str, Any], batch_metrics: Dict[str, Any]
    ) -> None:
        """After each workload (the batches between two boundaries), on every rank."""

    def on_validation_start(self) -> None:
        """Before validation."""

    def on_validation_epoch_start(self) -> None:
        """Before the first validation batch (``evaluate_batch`` trials)."""

    def on_validation_epoch_end(self, outputs: List[Any]) -> None:
        """After the last validation batch, with this rank's per-batch outputs."""

    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        """After validation, with the reduced metrics."""

    def on_checkpoint_load_start(self, checkpoint: Dict[str, Any]) -> None:
        """After ``state_dict.pth`` is read, before it is applied."""

    def on_checkpoint_save_start(self, checkpoint: Dict[str, Any]) -> None:
        """Before ``state_dict.pth`` is written; may add to or change ``checkpoint``."""

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Deprecated: use ``on_checkpoint_write_end``. Still called."""

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        """On the chief, after the checkpoint files are written."""

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        """On every rank, after the checkpoint is stored under ``uuid``."""

    def state_dict(self) -> Dict[str, Any]:
        """State to save in checkpoints."""
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


def _overrides(callback: PyTorchCallback, hook: str) -> bool:
    """Whether ``callback`` overrides ``hook`` of ``PyTorchCallback`` (in its class or
    as an instance attribute)."""
    method = getattr(callback, hook, None)
    func = getattr(method, "__func__", method)
    return func is not getattr(PyTorchCallback, hook)


def _epoch_start_takes_no_index(callback: PyTorchCallback) -> bool:
    """A legacy ``on_training_epoch_start(self)`` override (called without epoch_idx)."""
    if not _overrides(callback, "on_training_epoch_start"):
        return False
    try:
        params = inspect.signature(callback.on_training_epoch_start).parameters
    except (TypeError, ValueError):
        return False
    return not any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        for p in params.values()
    )
