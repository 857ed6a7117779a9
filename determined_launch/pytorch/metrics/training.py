"""``TrainingMetrics``: one workload's training metrics (spec 3.8).

Averaged over batches (and ranks), merged with the training reducers,
reported by the chief, logged to TensorBoard and broadcast, so every rank's
``on_training_workload_end`` sees the chief's numbers.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from determined_launch.pytorch.metrics.utils import (
    _combine_and_average_training_metrics,
    _convert_metrics_to_numpy,
)


def _average(values: list[Any]) -> Optional[float]:
    """Mean over batches of the non-None values; None when not averageable."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    try:
        return float(np.mean(present))
    except (TypeError, ValueError):
        return None


def pytorch_module() -> Any:
    # Looked up at call time: tests patch det.pytorch._log_tb_metrics.
    import determined_launch.pytorch as pt

    return pt


def tb_writer(context: Any) -> Any:
    """The chief's writer, or None when TensorBoard is not installed."""
    from determined_launch.pytorch.metrics.tensorboard import NullWriter

    writer = context.get_tensorboard_writer()
    return None if isinstance(writer, NullWriter) else writer


class TrainingMetrics:
    """Ends workloads: aggregate, report (chief), broadcast, call back."""

    def __init__(self, context: Any, core_context: Any, callbacks: dict[str, Any]) -> None:
        self._context = context
        self._train = core_context.train
        self._dist = context.distributed
        self._is_chief = self._dist.rank == 0
        self._callbacks = list(callbacks.values())

    def end_workload(
        self, per_batch: list[dict[str, Any]], batches_trained: int, epochs_trained: int,
        progress: Any,
    ) -> dict[str, Any]:
        """``{"avg_metrics", "batch_metrics"}`` of this workload, as the chief has them;
        ``on_training_workload_end`` has been called on this rank."""
        dist = self._dist
        batch_metrics = per_batch
        if dist.size > 1:
            batch_metrics = _combine_and_average_training_metrics(dist, per_batch)
        avg: dict[str, Any] = {}
        if batch_metrics:
            for key in batch_metrics[0]:
                avg[key] = _average([m.get(key) for m in batch_metrics])
        avg.update(_convert_metrics_to_numpy(self._context.reduce_metrics(for_training=True)))
        metrics: Optional[dict[str, Any]] = None
        if self._is_chief:
            avg.setdefault("batches", batches_trained)
            avg.setdefault("epochs", epochs_trained)
            self._train.report_training_metrics(
                steps_completed=batches_trained, metrics=avg, batch_metrics=batch_metrics
            )
            progress.training_report(batches_trained, epochs_trained, avg)
            if self._context.get_enable_tensorboard_logging():
                pytorch_module()._log_tb_metrics(
                    tb_writer(self._context), "train", batches_trained, avg, batch_metrics
                )
            self._context._publish_tensorboard()
            metrics = {"avg_metrics": avg, "batch_metrics": batch_metrics}
        if dist.size > 1:
            metrics = dist.broadcast(metrics)
        if metrics is None:
            raise RuntimeError("training metrics were not broadcast by the chief")
        for callback in self._callbacks:
            callback.on_training_workload_end(
                avg_metrics=metrics["avg_metrics"], batch_metrics=metrics["batch_metrics"]
            )
        return metrics
