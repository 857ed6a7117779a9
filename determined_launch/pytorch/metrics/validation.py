"""``Validator``: one validation pass (spec 3.8).

Sharded ``evaluate_batch`` (reduced per rank, then across ranks) or the
chief's ``evaluate_full_dataset``; validation callbacks; the chief's report,
TensorBoard and the checkpoint policy's answer, broadcast to every rank.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from determined_launch.pytorch.metrics.training import pytorch_module, tb_writer
from determined_launch.pytorch.metrics.utils import (
    _convert_metrics_to_numpy,
    _has_batch_idx,
    _prepare_metrics_reducers,
    _reduce_metrics,
)

logger = logging.getLogger("determined_launch.pytorch")


class Validator:
    """Validates ``trial``; ``policy`` (a ``CheckpointPolicy``) decides on the chief
    whether a validation earns a checkpoint."""

    def __init__(
        self, trial: Any, context: Any, core_context: Any, callbacks: dict[str, Any],
        policy: Any, test_mode: bool,
    ) -> None:
        self.trial = trial
        self.context = context
        self.core_train = core_context.train
        self.callbacks = list(callbacks.values())
        self.policy = policy
        self.test_mode = test_mode
        self.is_chief = context.distributed.rank == 0

    def validate(self, loader: Any, state: Any, progress: Any,
                 checkpoint_is_current: Callable[[], bool]) -> tuple[dict[str, Any], bool]:
        """Run validation on every rank over ``loader``; the chief reports and asks
        the checkpoint policy. Returns the metrics and whether to checkpoint now
        (the same answer on every rank); sets ``state.last_val``."""
        dist = self.context.distributed
        self.context.reset_reducers()
        for model in self.context.models:
            model.eval()
        start = time.time()
        for callback in self.callbacks:
            callback.on_validation_start()
        num_inputs = 0
        num_batches = 0
        with torch.no_grad():
            if type(self.trial).evaluate_batch is not _base_evaluate_batch():
                metrics, num_inputs, num_batches = self._evaluate_sharded(loader)
            else:
                metrics = {}
                if self.is_chief:
                    metrics = self.trial.evaluate_full_dataset(data_loader=loader)
                    if not isinstance(metrics, dict):
                        raise TypeError(
                            f"evaluate_full_dataset() must return a dict, got "
                            f"{type(metrics).__name__}"
                        )
                    metrics = _convert_metrics_to_numpy(metrics)
        metrics.update(_convert_metrics_to_numpy(self.context.reduce_metrics(for_training=False)))
        if dist.size > 1 and any(
            type(cb).on_validation_end is not _base_callback_method("on_validation_end")
            for cb in self.callbacks
        ):
            metrics = dist.broadcast(metrics)
        for callback in self.callbacks:
            callback.on_validation_end(metrics)
        state.last_val = state.batches_trained

        should_checkpoint = False
        if self.is_chief:
            elapsed = max(time.time() - start, 1e-9)
            if num_batches:
                logger.info(
                    "validated: %d records in %.3fs (%.3g records/s), in %d batches "
                    "(%.3g batches/s)", num_inputs, elapsed, num_inputs / elapsed,
                    num_batches, num_batches / elapsed,
                )
            if self.context.get_enable_tensorboard_logging():
                pytorch_module()._log_tb_metrics(
                    tb_writer(self.context), "val", state.batches_trained, metrics
                )
            self.context._publish_tensorboard()
            should_checkpoint = self.policy.wants_checkpoint(
                metrics, checkpoint_is_current=checkpoint_is_current()
            )
            # The same dict object callbacks received gains the counters.
            metrics.setdefault("batches", state.batches_trained)
            metrics.setdefault("epochs", state.epochs_trained)
            self.core_train.report_validation_metrics(
                steps_completed=state.batches_trained, metrics=metrics
            )
            progress.validation_report(
                state.batches_trained, state.epochs_trained, metrics
            )
        if dist.size > 1:
            should_checkpoint = bool(dist.broadcast(should_checkpoint))
        return metrics, should_checkpoint

    def _evaluate_sharded(self, loader: Any) -> tuple[dict[str, Any], int, int]:
        dist = self.context.distributed
        ctx = self.context
        for callback in self.callbacks:
            callback.on_validation_epoch_start()
        takes_idx = _has_batch_idx(self.trial.evaluate_batch)
        outputs: list[dict[str, Any]] = []
        num_inputs = 0
        for idx, batch in enumerate(loader):
            if ctx.experimental._auto_to_device:
                batch = ctx.to_device(batch)
            num_inputs += self.trial.get_batch_length(batch)
            if takes_idx:
                vm = self.trial.evaluate_batch(batch=batch, batch_idx=idx)
            else:
                vm = self.trial.evaluate_batch(batch=batch)
            if not isinstance(vm, dict):
                raise TypeError(
                    f"evaluate_batch() must return a dict of metrics, got {type(vm).__name__}"
                )
            vm = _convert_metrics_to_numpy(vm)
            if outputs and vm.keys() != outputs[0].keys():
                raise ValueError(
                    "Validation metric names must match across all batches of data: "
                    f"{sorted(outputs[0])} vs {sorted(vm)}"
                )
            outputs.append(vm)
            if self.test_mode:
                break
        for callback in self.callbacks:
            callback.on_validation_epoch_end(outputs)

        counts = dist.allgather(len(outputs)) if dist.size > 1 else [len(outputs)]
        if sum(counts) == 0:
            raise RuntimeError("validation_loader is empty.")
        # FIX-11: a rank with an empty shard takes the keys from a rank that has some.
        keys = list(outputs[0]) if outputs else None
        if dist.size > 1:
            keys = next(k for k in dist.allgather(keys) if k is not None)
        reducers = _prepare_metrics_reducers(self.trial.evaluation_reducer(), keys)
        metrics = _reduce_metrics(dist, outputs, keys, reducers)
        return metrics, num_inputs, len(outputs)


def _base_evaluate_batch() -> Any:
    from determined_launch.pytorch.api.trial import PyTorchTrial

    return PyTorchTrial.evaluate_batch


def _base_callback_method(name: str) -> Any:
    from determined_launch.pytorch.api.callback import PyTorchCallback

    return getattr(PyTorchCallback, name)
