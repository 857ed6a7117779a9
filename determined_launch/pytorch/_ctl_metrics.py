"""Training-metric aggregation and validation for the controller (spec 3.8/3.9)."""

from __future__ import annotations

import logging
import numbers
import time
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from determined_launch.core._rundir import read_jsonl
from determined_launch.pytorch._metric_utils import (
    _combine_and_average_training_metrics,
    _convert_metrics_to_numpy,
    _prepare_metrics_reducers,
    _reduce_metrics,
)

logger = logging.getLogger("determined_launch.pytorch")


def _average(values: list[Any]) -> Optional[float]:
    """Mean over batches of the non-None values; None when not averageable."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    try:
        return float(np.mean(present))
    except (TypeError, ValueError):
        return None


def _pytorch_module() -> Any:
    # Looked up at call time: tests patch det.pytorch._log_tb_metrics.
    import determined_launch.pytorch as pt

    return pt


class _MetricsMixin:
    context: Any
    core_context: Any
    trial: Any
    state: Any
    callbacks: dict[str, Any]
    is_chief: bool
    test_mode: bool
    validation_loader: Any
    searcher_metric_name: Optional[str]
    smaller_is_better: bool
    ckpt_policy: str
    last_validation_metrics: Optional[dict[str, Any]]
    _progress: Any

    if TYPE_CHECKING:  # provided by _CheckpointMixin

        def _checkpoint(self, already_exiting: bool) -> None: ...

        def _checkpoint_is_current(self) -> bool: ...

    def _tb_writer(self) -> Any:
        """The chief's writer, or None when TensorBoard is not installed."""
        from determined_launch.pytorch._context import _NullWriter

        writer = self.context.get_tensorboard_writer()
        return None if isinstance(writer, _NullWriter) else writer

    # ------------------------------------------------------------ training
    def _end_workload(self, per_batch: list[dict[str, Any]]) -> dict[str, Any]:
        """Aggregate, report and broadcast one workload's training metrics, then
        ``on_training_workload_end`` on every rank (with the chief's numbers)."""
        dist = self.context.distributed
        batch_metrics = per_batch
        if dist.size > 1:
            batch_metrics = _combine_and_average_training_metrics(dist, per_batch)
        avg: dict[str, Any] = {}
        if batch_metrics:
            for key in batch_metrics[0]:
                avg[key] = _average([m.get(key) for m in batch_metrics])
        avg.update(_convert_metrics_to_numpy(self.context.reduce_metrics(for_training=True)))
        metrics: Optional[dict[str, Any]] = None
        if self.is_chief:
            avg.setdefault("batches", self.state.batches_trained)
            avg.setdefault("epochs", self.state.epochs_trained)
            self.core_context.train.report_training_metrics(
                steps_completed=self.state.batches_trained,
                metrics=avg,
                batch_metrics=batch_metrics,
            )
            self._progress.training_report(
                self.state.batches_trained, self.state.epochs_trained, avg
            )
            if self.context.get_enable_tensorboard_logging():
                _pytorch_module()._log_tb_metrics(
                    self._tb_writer(), "train", self.state.batches_trained, avg, batch_metrics
                )
            metrics = {"avg_metrics": avg, "batch_metrics": batch_metrics}
        if dist.size > 1:
            metrics = dist.broadcast(metrics)
        if metrics is None:
            raise RuntimeError("training metrics were not broadcast by the chief")
        for callback in self.callbacks.values():
            callback.on_training_workload_end(
                avg_metrics=metrics["avg_metrics"], batch_metrics=metrics["batch_metrics"]
            )
        return metrics

    # ------------------------------------------------------------ validation
    def _validation_is_current(self) -> bool:
        return bool(self.state.last_val == self.state.batches_trained)

    def _validate(self, searcher_op: Any = None) -> dict[str, Any]:
        """Run validation on every rank; the chief reports, applies the
        checkpoint policy and tells the others whether to checkpoint."""
        dist = self.context.distributed
        self.context.reset_reducers()
        for model in self.context.models:
            model.eval()
        start = time.time()
        for callback in self.callbacks.values():
            callback.on_validation_start()
        num_inputs = 0
        num_batches = 0
        with torch.no_grad():
            if type(self.trial).evaluate_batch is not _base_evaluate_batch():
                metrics, num_inputs, num_batches = self._evaluate_sharded()
            else:
                metrics = {}
                if self.is_chief:
                    metrics = self.trial.evaluate_full_dataset(data_loader=self.validation_loader)
                    if not isinstance(metrics, dict):
                        raise TypeError(
                            f"evaluate_full_dataset() must return a dict, got "
                            f"{type(metrics).__name__}"
                        )
                    metrics = _convert_metrics_to_numpy(metrics)
        metrics.update(_convert_metrics_to_numpy(self.context.reduce_metrics(for_training=False)))
        if dist.size > 1 and any(
            type(cb).on_validation_end is not _base_callback_method("on_validation_end")
            for cb in self.callbacks.values()
        ):
            metrics = dist.broadcast(metrics)
        for callback in self.callbacks.values():
            callback.on_validation_end(metrics)
        self.state.last_val = self.state.batches_trained

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
                _pytorch_module()._log_tb_metrics(
                    self._tb_writer(), "val", self.state.batches_trained, metrics
                )
            should_checkpoint = self._policy_wants_checkpoint(metrics)
            # The same dict object callbacks received gains the counters.
            metrics.setdefault("batches", self.state.batches_trained)
            metrics.setdefault("epochs", self.state.epochs_trained)
            self.core_context.train.report_validation_metrics(
                steps_completed=self.state.batches_trained, metrics=metrics
            )
            self._progress.validation_report(
                self.state.batches_trained, self.state.epochs_trained, metrics
            )
        if dist.size > 1:
            should_checkpoint = bool(dist.broadcast(should_checkpoint))
        self.last_validation_metrics = metrics
        if should_checkpoint:
            self._checkpoint(already_exiting=False)
        return metrics

    def _evaluate_sharded(self) -> tuple[dict[str, Any], int, int]:
        dist = self.context.distributed
        ctx = self.context
        for callback in self.callbacks.values():
            callback.on_validation_epoch_start()
        takes_idx = _has_batch_idx(self.trial.evaluate_batch)
        outputs: list[dict[str, Any]] = []
        num_inputs = 0
        for idx, batch in enumerate(self.validation_loader):
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
        for callback in self.callbacks.values():
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

    # ------------------------------------------------------------ checkpoint policy
    def _policy_wants_checkpoint(self, metrics: dict[str, Any]) -> bool:
        if self.ckpt_policy == "none":
            return False
        if self.ckpt_policy == "all" or self.searcher_metric_name is None:
            return not self._checkpoint_is_current()
        value = self._searcher_value(metrics, self.searcher_metric_name)
        best = self._best_validation()  # asked even when current, as upstream
        if self._checkpoint_is_current():
            return False
        if best is None:
            return True
        return value < best if self.smaller_is_better else value > best

    @staticmethod
    def _searcher_value(metrics: dict[str, Any], name: str) -> float:
        if name not in metrics:
            raise RuntimeError(
                f"Search method is configured to use metric '{name}' but model definition "
                f"returned validation metrics {list(metrics.keys())}. The metric used by the "
                "search method must be one of the validation metrics returned by the model "
                "definition."
            )
        value = metrics[name]
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            raise RuntimeError(
                f"Searcher validation metric '{name}' returned a non-scalar value: {value!r}"
            )
        return float(value)  # type: ignore[arg-type]

    def _best_validation(self) -> Optional[float]:
        """Best searcher metric so far: the master's answer where there is one
        (``train.get_experiment_best_validation``), else this run directory's."""
        ask = getattr(self.core_context.train, "get_experiment_best_validation", None)
        best = ask() if ask is not None else None
        if best is not None:  # off-cluster the Core API answers None: no master
            return float(best)
        run_dir = getattr(self.core_context, "run_dir", None)
        if run_dir is None or self.searcher_metric_name is None:
            return None
        try:
            records = read_jsonl(f"{run_dir}/validation.jsonl")
        except FileNotFoundError:
            return None
        values = [
            r["metrics"][self.searcher_metric_name] for r in records
            if isinstance(r.get("metrics"), dict)
            and isinstance(r["metrics"].get(self.searcher_metric_name), (int, float))
        ]
        if not values:
            return None
        return float(min(values) if self.smaller_is_better else max(values))


def _base_evaluate_batch() -> Any:
    from determined_launch.pytorch._trial import PyTorchTrial

    return PyTorchTrial.evaluate_batch


def _base_callback_method(name: str) -> Any:
    from determined_launch.pytorch._callback import PyTorchCallback

    return getattr(PyTorchCallback, name)


def _has_batch_idx(fn: Any) -> bool:
    """Upstream's ``has_param(fn, "batch_idx", 2)``: a parameter of that name,
    or at least 2 positional parameters besides ``self`` on a bound method."""
    import inspect

    params = inspect.signature(fn).parameters
    return "batch_idx" in params or len(params) >= 2
