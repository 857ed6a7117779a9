"""Determined 0.38.1's module path ``determined.pytorch._reducer``: re-exports only
(code and tests written against Determined import it).
The code lives in metrics/reducer.py."""

# ruff: noqa: F401
from determined_launch.pytorch.metrics.reducer import (
    MetricReducer,
    Reducer,
    _PyTorchReducerContext,
    _simple_reduce_metrics,
    _SimpleReducer,
    _WrappedReducer,
    default_allgather_fn,
)
