"""``PyTorchTrial``, the class users subclass, and ``_TrialState``, the
counters a checkpoint carries. The loop that drives a trial is
``loop.controller._PyTorchTrialController``."""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from determined_launch.pytorch.api._buildable import buildable_class  # noqa: F401  (its old home)
from determined_launch.pytorch.api.context import PyTorchTrialContext
from determined_launch.pytorch.data.loader import DataLoader, data_length
from determined_launch.pytorch.metrics.reducer import Reducer

if TYPE_CHECKING:
    from determined_launch.pytorch.api.callback import PyTorchCallback


@dataclasses.dataclass
class _TrialState:
    """What ``trial_state.pkl`` holds; upstream pickles ``vars()`` of this."""

    trial_id: int = 0
    last_ckpt: int = 0
    step_id: int = 0
    last_val: int = 0
    batches_trained: int = 0
    epochs_trained: int = 0


class PyTorchTrial(metaclass=abc.ABCMeta):
    """A trial: build your models, optimizers and data loaders in ``__init__`` and
    the ``build_*`` methods, train one batch in ``train_batch``, and validate in
    exactly one of ``evaluate_batch`` or ``evaluate_full_dataset``."""

    trial_context_class = PyTorchTrialContext
    #: set by ``loop.controller`` (which imports this module, never the reverse);
    #: importing the package imports both
    trial_controller_class: Any = None

    @abc.abstractmethod
    def __init__(self, context: PyTorchTrialContext) -> None:
        """Wrap models and optimizers with ``context.wrap_model``/``wrap_optimizer``."""

    @abc.abstractmethod
    def train_batch(
        self, batch: Any, epoch_idx: int, batch_idx: int
    ) -> Union[torch.Tensor, dict[str, Any]]:
        """Train one batch; return the loss or a dict of metrics.

        ``batch_idx`` and ``epoch_idx`` are global: counted from the start of
        the trial, across epochs and resumes."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> Union[DataLoader, torch.utils.data.DataLoader]:
        """A ``det.pytorch.DataLoader`` (recommended: repeat, shard, skip and
        deterministic shuffle are handled for you)."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> Union[DataLoader, torch.utils.data.DataLoader]:
        """The validation data; sharded across ranks when ``evaluate_batch`` is used."""

    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        """Named callbacks; dict order is call order."""
        return {}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """Validation metrics of one batch, reduced with ``evaluation_reducer()``."""
        raise NotImplementedError

    def evaluation_reducer(self) -> Union[Reducer, dict[str, Reducer]]:
        """How ``evaluate_batch`` metrics are combined: one ``Reducer`` or one per key."""
        return Reducer.AVG

    def evaluate_full_dataset(self, data_loader: torch.utils.data.DataLoader) -> dict[str, Any]:
        """Validation metrics over the whole loader, run on the chief only."""
        raise NotImplementedError

    def get_batch_length(self, batch: Any) -> int:
        """Records in ``batch`` (for throughput logs)."""
        return data_length(batch)


def _evaluate_batch_defined(trial: PyTorchTrial) -> bool:
    return type(trial).evaluate_batch is not PyTorchTrial.evaluate_batch


def _evaluate_full_dataset_defined(trial: PyTorchTrial) -> bool:
    return type(trial).evaluate_full_dataset is not PyTorchTrial.evaluate_full_dataset


def _state_from_dict(data: Optional[dict[str, Any]], trial_id: int) -> _TrialState:
    if not data:
        return _TrialState(trial_id=trial_id)
    fields = {f.name for f in dataclasses.fields(_TrialState)}
    values = {k: int(v or 0) for k, v in data.items() if k in fields and k != "trial_id"}
    tid = data.get("trial_id")
    return _TrialState(trial_id=int(tid) if tid is not None else trial_id, **values)

