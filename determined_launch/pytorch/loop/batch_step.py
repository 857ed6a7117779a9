"""``BatchStep``: the per-batch path of training (spec 3.5/3.6), one flat loop.

``run`` trains the batches of one *segment*: consecutive batches of one epoch
before which nothing but training happens (the loop ends a segment at the next
batch count where a boundary can be reached, and at the epoch's end). All that
can be decided once per segment is (which optional work a batch needs: the
aggregation window, AMP, Apex, a profiler, LR schedulers; whether batches must
be moved to the device), so that the common batch is: fetch, ``train_batch``,
its metrics read into numpy, the preemption poll. The model step evicts the
loop's code and data from the CPU caches, so each call on this path costs
1-3 µs (BENCHMARKS.md, Trainer overhead): the path makes as few as it can.
"""

from __future__ import annotations

import itertools
import logging
import math
import warnings
from collections.abc import Iterator
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.utils.data as tud

from determined_launch.pytorch.api.callback import PyTorchCallback, _epoch_start_takes_no_index
from determined_launch.pytorch.data.loader import _cpu_tensors
from determined_launch.pytorch.metrics.utils import SCALAR_DTYPES

logger = logging.getLogger("determined_launch.pytorch")

_Tensor = torch.Tensor
_array = np.array
#: collate functions whose batches hold tensors wherever a dataset's samples do
#: (numpy arrays and numbers become tensors): one batch of CPU tensors stands for all
_TENSOR_COLLATES = (tud.default_collate, tud.default_convert)


class _ScalarDtypes(dict[Any, Any]):
    """``SCALAR_DTYPES``, None for other dtypes: a subscript, not a ``get`` call."""

    def __missing__(self, key: Any) -> None:
        return None


_SCALAR = _ScalarDtypes(SCALAR_DTYPES)
#: as good as never: no poll (``run`` without a preemption context)
_NEVER = -1


class BatchStep:
    """Trains batches of ``trial`` with ``context``; ``run`` a segment, ``__call__`` one batch."""

    def __init__(self, trial: Any, context: Any, callbacks: dict[str, PyTorchCallback]) -> None:
        self._trial = trial
        self._context = context
        self._callbacks: list[Any] = list(callbacks.values())
        self._legacy_epoch_start = [_epoch_start_takes_no_index(cb) for cb in self._callbacks]
        self._warned_nan = False
        self._loader: Any = None
        # How a batch gets to the device: decided on the first batch (_decide_move).
        self._mover: Optional[Callable[[Any], Any]] = self._decide_move

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
        """Train one batch (as ``run`` does); its metrics."""
        out: list[dict[str, Any]] = []
        self.run(iter([batch]), None, epoch_idx, batch_idx, batch_idx + 1, out, None)
        return out[0]

    def run(
        self, batches: Iterator[Any], loader: Any, epoch_idx: int, batch_idx: int, stop: int,
        per_batch: list[dict[str, Any]], preempt: Any,
        batch_done: Optional[Callable[[int], None]] = None,
    ) -> tuple[int, Iterator[Any], bool]:
        """Train batches ``batch_idx`` .. ``stop - 1`` of epoch ``epoch_idx``, each
        batch's metrics appended to ``per_batch``, until ``preempt`` (a core
        ``PreemptContext``, or None) says to stop: ``should_preempt(block=False)``
        after every batch (FIX-12), made as a countdown of the polls it knows
        return False (``quiet_polls``), so a batch between sync points calls
        nothing. Returns the next batch index, the batch iterator (a new one
        after a finite ``loader`` ended: FIX-13) and whether preemption stopped it."""
        ctx = self._context
        optim = ctx._optim
        train = self._trial.train_batch
        self._loader = loader
        move = self._mover if ctx.experimental._auto_to_device else None
        # Optional per-batch work, all in _train_extras; without any, the optimizer
        # steps every batch and the window flag is set once here.
        extras = (
            optim._use_amp or optim._use_apex or ctx.profiler is not None
            or bool(optim.lr_schedulers)
            or (optim._managed_training and optim._aggregation_frequency > 1)
        )
        if not extras:
            optim.start_batch(batch_idx)
        fetch = batches.__next__
        quiet = skip = _NEVER if preempt is None else preempt.quiet_polls()
        while batch_idx < stop:
            try:
                batch = fetch()
            except StopIteration:
                batches = _restart(loader)
                fetch = batches.__next__
                batch = fetch()
            if move is not None:
                batch = move(batch)
                move = self._mover
            ctx._batch_idx = batch_idx  # = ctx._current_batch_idx = batch_idx, without the property
            if extras:
                metrics = self._train_extras(train, batch, epoch_idx, batch_idx)
            else:
                metrics = train(batch=batch, epoch_idx=epoch_idx, batch_idx=batch_idx)
            if type(metrics) is not dict:
                metrics = _as_dict(metrics)
            # Read now (a tensor updated in place later must not change this batch's
            # value): a 0-d tensor as np.array(item(), dtype), one torch op; the NaN
            # check of a 0-d loss on that item.
            checked = self._warned_nan
            for name, value in metrics.items():
                if type(value) is _Tensor and not value.ndim:
                    dtype = _SCALAR[value.dtype]
                    if dtype is not None:
                        scalar = value.item()
                        metrics[name] = _array(scalar, dtype)
                        if name == "loss" and not checked:
                            checked = scalar == scalar  # NaN: the general check warns
                        continue
                if isinstance(value, _Tensor):
                    metrics[name] = value.numpy(force=True)  # = detach().cpu().numpy()
            if not checked:
                self._check_nan(metrics.get("loss"), batch_idx)
            per_batch.append(metrics)
            batch_idx += 1
            if batch_done is not None:
                batch_done(batch_idx)
            if quiet:  # < 0: never
                quiet -= 1
                continue
            preempt.skip_polls(skip)
            if preempt.should_preempt(block=False):
                return batch_idx, batches, True
            quiet = skip = preempt.quiet_polls()
        if skip > 0:
            preempt.skip_polls(skip - quiet)  # the polls counted down in this segment
        return batch_idx, batches, False

    def _train_extras(self, train: Any, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        """``train_batch`` with the window flag, a profiler, the AMP scaler update
        and the automatic LR steps (by batch counts only, never by workloads: 3.6)."""
        ctx = self._context
        optim = ctx._optim
        optim.start_batch(batch_idx)
        profiler = ctx.profiler
        if profiler is not None:
            with profiler:
                metrics = train(batch=batch, epoch_idx=epoch_idx, batch_idx=batch_idx)
            profiler.step()
        else:
            metrics = train(batch=batch, epoch_idx=epoch_idx, batch_idx=batch_idx)
        communicate = optim.communicate
        if optim._use_amp and communicate:
            optim._scaler.update()
        if communicate and optim.lr_schedulers:
            agg, epoch_len = optim._aggregation_frequency, ctx._epoch_len
            for scheduler in optim.lr_schedulers:
                scheduler._auto_step(batch_idx, agg, epoch_len)
        return metrics

    def _decide_move(self, batch: Any) -> Any:
        """Moves the first batch; decides for the rest. On the CPU, a loader that
        collates with torch's default (tensors wherever the samples hold tensors,
        arrays or numbers) and gave a batch of CPU tensors is not moved again."""
        ctx = self._context
        loader = self._loader
        same = (
            ctx._on_cpu and isinstance(loader, tud.DataLoader)
            and loader.collate_fn in _TENSOR_COLLATES and _cpu_tensors(batch)
        )
        self._mover = None if same else ctx.to_device
        return ctx.to_device(batch)

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


def _as_dict(metrics: Any) -> dict[str, Any]:
    """``train_batch``'s result as a dict: a tensor is the loss."""
    if isinstance(metrics, _Tensor):
        return {"loss": metrics}
    if not isinstance(metrics, dict):
        raise TypeError(
            f"train_batch() must return a torch.Tensor (the loss) or a dict of metrics, "
            f"got {type(metrics).__name__}"
        )
    return metrics


def _restart(loader: Any) -> Iterator[Any]:
    """A finite custom loader ended: its next pass (FIX-13: upstream would stop
    yielding and spin), which must yield a batch."""
    batches = iter(loader) if loader is not None else iter(())
    first = next(batches, _EMPTY)
    if first is _EMPTY:
        raise ValueError(
            "the training data loader yielded no batches; give it at least one batch"
        )
    return itertools.chain((first,), batches)


_EMPTY = object()


def check_metric_keys(per_batch: list[dict[str, Any]], first_batch_idx: int) -> None:
    """Every batch of a workload returned the same metric names (checked once
    per workload, warm, rather than on every batch)."""
    if not per_batch:
        return
    keys = per_batch[0].keys()
    for offset, metrics in enumerate(per_batch):
        if metrics.keys() != keys:
            raise ValueError(
                f"train_batch returned metric keys {sorted(metrics)} at batch "
                f"{first_batch_idx + offset} but {sorted(keys)} earlier; return the same keys "
                "every batch"
            )
