"""``BatchStep``: one training batch (spec 3.5/3.6).

Epoch-start/end callbacks, ``train_batch``, the auto-AMP scaler update,
automatic LR stepping, metric conversion and the NaN-loss warning. It owns
only what a batch needs (the NaN warning's once-flag, which callbacks take
the legacy zero-argument epoch start); the loop calls it once per batch.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import numpy as np
import torch

from determined_launch.pytorch.api.callback import PyTorchCallback, _epoch_start_takes_no_index
from determined_launch.pytorch.metrics.utils import SCALAR_DTYPES

logger = logging.getLogger("determined_launch.pytorch")

_Tensor = torch.Tensor
_SCALAR_DTYPES = SCALAR_DTYPES
_array = np.array


class BatchStep:
    """Trains one batch of ``trial`` with ``context``; returns its metrics."""

    def __init__(self, trial: Any, context: Any, callbacks: dict[str, PyTorchCallback]) -> None:
        self._trial = trial
        self._context = context
        self._callbacks: list[Any] = list(callbacks.values())
        self._legacy_epoch_start = [_epoch_start_takes_no_index(cb) for cb in self._callbacks]
        self._warned_nan = False

    def epoch_start(self, epoch_idx: int) -> None:
        for callback, legacy in zip(self._callbacks, self._legacy_epoch_start):
            if legacy:
                warnings.warn(
                    "on_training_epoch_start() without an epoch_idx parameter is deprecated",
                    FutureWarning,
                    stacklevel=2,
                )
                callback.on_training_epoch_start()
            else:
                callback.on_training_epoch_start(epoch_idx)

    def epoch_end(self, epoch_idx: int) -> None:
        for callback in self._callbacks:
            callback.on_training_epoch_end(epoch_idx)

    def __call__(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        ctx = self._context
        optim = ctx._optim
        ctx._batch_idx = batch_idx  # = ctx._current_batch_idx = batch_idx, without the property
        optim.start_batch(batch_idx)
        if ctx.experimental._auto_to_device:
            batch = ctx.to_device(batch)
        profiler = ctx.profiler
        if profiler is not None:
            with profiler:
                metrics = self._trial.train_batch(
                    batch=batch, epoch_idx=epoch_idx, batch_idx=batch_idx
                )
            profiler.step()
        else:
            metrics = self._trial.train_batch(batch=batch, epoch_idx=epoch_idx, batch_idx=batch_idx)
        communicate = optim.communicate
        if optim._use_amp and communicate:
            optim._scaler.update()
        if isinstance(metrics, _Tensor):
            metrics = {"loss": metrics}
        elif not isinstance(metrics, dict):
            raise TypeError(
                f"train_batch() must return a torch.Tensor (the loss) or a dict of metrics, "
                f"got {type(metrics).__name__}"
            )
        if communicate and optim.lr_schedulers:
            agg, epoch_len = optim._aggregation_frequency, ctx._epoch_len
            for scheduler in optim.lr_schedulers:
                # by batch counts only, never by workloads (3.6)
                scheduler._auto_step(batch_idx, agg, epoch_len)
        # _convert_metrics_to_numpy, inlined; a 0-d loss's NaN check on its item()
        checked = self._warned_nan
        for name, value in metrics.items():
            if isinstance(value, _Tensor):
                dtype = _SCALAR_DTYPES.get(value.dtype) if type(value) is _Tensor else None
                if dtype is not None and value.ndim == 0:
                    scalar = value.item()
                    metrics[name] = _array(scalar, dtype)
                    if name == "loss" and not checked:
                        checked = scalar == scalar  # NaN: the general check below warns
                else:
                    metrics[name] = value.numpy(force=True)
        if not checked:
            self._check_nan(metrics.get("loss"), batch_idx)
        return metrics

    def _check_nan(self, loss: Any, batch_idx: int) -> None:
        """Warn once when the loss becomes NaN (training goes on: no hang, no crash)."""
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
