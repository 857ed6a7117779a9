"""Metric reducers: built-in ``Reducer`` kinds and custom cross-rank ``MetricReducer``s.

A custom reducer runs in two stages: every rank computes ``per_slot_reduce()``
(something small and picklable), one allgather moves all of them to every rank,
then ``cross_slot_reduce()`` combines them. ``_PyTorchReducerContext`` owns the
reducers a trial wrapped and gets its allgather from the trial context.
"""

from __future__ import annotations

import abc
import enum
import itertools
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np


class Reducer(enum.Enum):
    """How ``evaluate_batch`` metrics are combined over batches and ranks."""

    AVG = 1
    SUM = 2
    MAX = 3
    MIN = 4


def _simple_reduce_metrics(
    reducer: Reducer, metrics: np.ndarray, num_batches: Optional[List[int]] = None
) -> Any:
    """Reduce along axis 0. AVG is weighted by ``num_batches`` when given (per-rank counts)."""
    if reducer is Reducer.AVG:
        if num_batches and len(metrics) != len(num_batches):
            raise RuntimeError(
                "Lengths of metrics and num_batches are not equal: "
                f"{len(metrics)} != {len(num_batches)}."
            )
        return np.average(metrics, weights=num_batches or None)
    if reducer is Reducer.SUM:
        return np.sum(metrics)
    if reducer is Reducer.MAX:
        return np.max(metrics)
    if reducer is Reducer.MIN:
        return np.min(metrics)
    raise NotImplementedError(f"unknown reducer {reducer!r}; use a det.pytorch.Reducer")


class MetricReducer(abc.ABC):
    """A custom reducer: ``reset`` per workload, ``per_slot_reduce`` per rank, then
    ``cross_slot_reduce`` over the list of every rank's ``per_slot_reduce`` result.

    How values get in is up to the subclass (typically an ``update()`` method
    called from ``train_batch``/``evaluate_batch``). ``cross_slot_reduce``
    returns one metric (when wrapped with a ``name``) or a dict of metrics
    (when wrapped with ``name=None``).
    """

    @abc.abstractmethod
    def reset(self) -> None:
        """Clear the state; called before each training workload or validation."""

    @abc.abstractmethod
    def per_slot_reduce(self) -> Any:
        """This rank's partial result; must be picklable."""

    @abc.abstractmethod
    def cross_slot_reduce(self, per_slot_metrics: List) -> Any:
        """Combine every rank's ``per_slot_reduce()`` result (in rank order)."""


class _NotMetric:
    """Fill value for ranks that saw fewer values (never a real metric)."""


_NOT_METRIC = _NotMetric()


class _SimpleReducer(MetricReducer):
    """A plain function over all values, as a ``MetricReducer`` with ``update(value)``."""

    NOT_METRIC = _NOT_METRIC

    def __init__(self, fn: Callable[[List[Any]], Any]) -> None:
        self.fn = fn
        self.values: List[Any] = []

    def reset(self) -> None:
        self.values = []

    def update(self, value: Any) -> None:
        self.values.append(value)

    def per_slot_reduce(self) -> Any:
        return self.values

    def cross_slot_reduce(self, per_slot_metrics: List) -> Any:
        # Ranks took batches round-robin, so interleaving their lists restores
        # the batch order (exact when update() is called once per batch).
        interleaved = itertools.zip_longest(*per_slot_metrics, fillvalue=_NOT_METRIC)
        flat = [v for row in interleaved for v in row if v is not _NOT_METRIC]
        return self.fn(flat)


def default_allgather_fn(metrics: Any) -> List:
    """The single-process allgather: this rank's value is everyone's."""
    return [metrics]


class _WrappedReducer:
    """A reducer with its name and workload kinds; names the reducer in errors."""

    def __init__(
        self, reducer: MetricReducer, name: Optional[str], for_training: bool, for_validation: bool
    ) -> None:
        self.reducer = reducer
        self.name = name
        self.for_training = for_training
        self.for_validation = for_validation

    def _failed(self, call: str) -> ValueError:
        return ValueError(
            f'reducer of type {type(self.reducer).__name__} for name="{self.name}" '
            f"failed in a call to {call}"
        )

    def reset(self) -> None:
        try:
            self.reducer.reset()
        except Exception as e:
            raise self._failed("reset()") from e

    def per_slot_reduce(self) -> Any:
        try:
            return self.reducer.per_slot_reduce()
        except Exception as e:
            raise self._failed("per_slot_reduce()") from e

    def cross_slot_reduce(self, per_slot_metrics: List) -> Any:
        try:
            return self.reducer.cross_slot_reduce(per_slot_metrics)
        except Exception as e:
            raise self._failed("cross_slot_reduce()") from e

    def describe(self) -> str:
        if isinstance(self.reducer, _SimpleReducer):
            fn_name = getattr(self.reducer.fn, "__name__", type(self.reducer.fn).__name__)
            return f"The custom reduction function {fn_name}()"
        return f"The custom reduction MetricReducer {type(self.reducer).__name__}"


class _PyTorchReducerContext:
    """The reducers one trial wrapped, reduced with one allgather per workload."""

    def __init__(self, allgather_fn: Callable[[Any], List[Any]] = default_allgather_fn) -> None:
        self._allgather_fn = allgather_fn
        self._wrapped_reducers: List[_WrappedReducer] = []

    def reset_reducers(self) -> None:
        for wrapped in self._wrapped_reducers:
            wrapped.reset()

    def wrap_reducer(
        self,
        reducer: Union[Callable, MetricReducer],
        name: Optional[str] = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> MetricReducer:
        """Register ``reducer`` (a function over all values, or a ``MetricReducer``).

        Returns the ``MetricReducer``; for a function it is a ``_SimpleReducer``
        whose ``update(value)`` the trial calls once per batch.
        """
        if any(w.reducer is reducer for w in self._wrapped_reducers):
            raise AssertionError(
                f"Detected the same reducer of type {type(reducer).__name__} in "
                "context.wrap_reducer(), please avoid calling wrap_reducer() on the "
                "same reducer object twice."
            )
        if not isinstance(reducer, MetricReducer):
            if not callable(reducer):
                raise AssertionError(
                    f"Detected invalid reducer in wrap_reducer() of type {type(reducer).__name__}. "
                    "Reducers must either be a function or a subclass of pytorch.MetricReducer."
                )
            reducer = _SimpleReducer(reducer)
        self._wrapped_reducers.append(_WrappedReducer(reducer, name, for_training, for_validation))
        return reducer

    def _selected(self, for_training: bool) -> List[_WrappedReducer]:
        return [
            w
            for w in self._wrapped_reducers
            if (w.for_training if for_training else w.for_validation)
        ]

    def reduce_metrics(self, for_training: bool) -> Dict[str, Any]:
        """Reduce the training (or validation) reducers; collective when any exist.

        Every rank must call it at the same point (it allgathers); every rank
        gets the same result.
        """
        reducables = self._selected(for_training)
        if not reducables:
            return {}
        gathered = self._allgather_fn([w.per_slot_reduce() for w in reducables])
        return self.run_cross_slot_reduction(reducables, gathered)

    def run_cross_slot_reduction(
        self, reducables: List[_WrappedReducer], gathered: Sequence[Sequence[Any]]
    ) -> Dict[str, Any]:
        """``gathered[rank][i]`` is rank's ``per_slot_reduce`` of ``reducables[i]``."""
        metrics: Dict[str, Any] = {}
        per_reducer = list(zip(*gathered)) if gathered else []
        for wrapped, per_slot in zip(reducables, per_reducer):
            reduced = wrapped.cross_slot_reduce(list(per_slot))
            if wrapped.name is None:
                if not isinstance(reduced, dict):
                    raise AssertionError(
                        f"{wrapped.describe()} was wrapped by a call to wrap_reducer() with "
                        f"name=None but it did not return a dict (it returned a "
                        f"{type(reduced).__name__}). Set name to return a single metric, or "
                        "return a dict mapping names to metrics to return several."
                    )
                metrics.update(reduced)
            else:
                if isinstance(reduced, dict):
                    raise AssertionError(
                        f"{wrapped.describe()} was wrapped by a call to wrap_reducer() with "
                        "name set but it returned a dict anyway. Set name=None to return a "
                        "dict of metrics, or return a single (non-dict) metric for the name "
                        f"{wrapped.name!r}."
                    )
                metrics[wrapped.name] = reduced
        return metrics
