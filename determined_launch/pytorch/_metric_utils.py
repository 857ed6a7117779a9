"""Determined 0.38.1's module path ``determined.pytorch._metric_utils``: re-exports only
(code and tests written against Determined import it).
The code lives in metrics/utils.py and metrics/tensorboard.py."""

# ruff: noqa: F401
from determined_launch.pytorch.metrics.tensorboard import _log_tb_metrics
from determined_launch.pytorch.metrics.utils import (
    _average_training_metrics,
    _combine_and_average_training_metrics,
    _combine_metrics_across_processes,
    _convert_metrics_to_numpy,
    _prepare_metrics_reducers,
    _process_combined_metrics_and_batches,
    _reduce_metrics,
)
