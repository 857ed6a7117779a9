"""One training batch for the controller (spec 3.5/3.6): epoch-start
callbacks, ``train_batch``, auto-AMP scaler update, automatic LR stepping,
metric conversion and the NaN-loss warning."""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import numpy as np
import torch

from determined_launch.pytorch._lr_scheduler import LRScheduler
from determined_launch.pytorch._metric_utils import _convert_metrics_to_numpy

logger = logging.getLogger("determined_launch.pytorch")


class _BatchMixin:
    context: Any
    trial: Any
    callbacks: dict[str, Any]
    _legacy_epoch_start: dict[str, bool]
    _warned_nan: bool

    def _on_epoch_start(self, epoch_idx: int) -> None:
        for name, callback in self.callbacks.items():
            if self._legacy_epoch_start[name]:
                warnings.warn(
                    "on_training_epoch_start() without an epoch_idx parameter is deprecated",
                    FutureWarning,
                    stacklevel=2,
                )
                callback.on_training_epoch_start()
            else:
                callback.on_training_epoch_start(epoch_idx)

    def _train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        ctx = self.context
        ctx._current_batch_idx = batch_idx
        ctx._loss_ids = {}
        if ctx.experimental._auto_to_device:
            batch = ctx.to_device(batch)
        if ctx.profiler is not None:
            with ctx.profiler:
                metrics = self.trial.train_batch(batch=batch, epoch_idx=epoch_idx,
                                                 batch_idx=batch_idx)
            ctx.profiler.step()
        else:
            metrics = self.trial.train_batch(batch=batch, epoch_idx=epoch_idx, batch_idx=batch_idx)
        communicate = ctx._should_communicate_and_update()
        if ctx._use_amp and communicate:
            ctx._scaler.update()
        if isinstance(metrics, torch.Tensor):
            metrics = {"loss": metrics}
        if not isinstance(metrics, dict):
            raise TypeError(
                f"train_batch() must return a torch.Tensor (the loss) or a dict of metrics, "
                f"got {type(metrics).__name__}"
            )
        if communicate:
            for scheduler in ctx.lr_schedulers:
                self._auto_step_lr_scheduler_per_batch(batch_idx, scheduler)
        metrics = _convert_metrics_to_numpy(metrics)
        self._check_nan(metrics, batch_idx)
        return metrics

    def _check_nan(self, metrics: dict[str, Any], batch_idx: int) -> None:
        """Warn once when the loss becomes NaN (training goes on: no hang, no crash)."""
        if self._warned_nan:
            return
        loss = metrics.get("loss")
        if loss is None:
            return
        try:
            if isinstance(loss, np.ndarray) and loss.size == 1:
                bad = math.isnan(float(loss))  # the common case, without numpy ufuncs
            else:
                bad = bool(np.any(np.isnan(loss)))
        except (TypeError, ValueError):
            return
        if bad:
            self._warned_nan = True
            logger.warning("loss is NaN at batch %d; training continues (check the learning "
                           "rate and the data)", batch_idx)

    def _auto_step_lr_scheduler_per_batch(self, batch_idx: int, lr_scheduler: LRScheduler) -> None:
        """Step a wrapped scheduler by batch counts only (never by workloads, 3.6)."""
        lr_scheduler._auto_step(
            batch_idx, self.context._aggregation_frequency, self.context._epoch_len
        )
