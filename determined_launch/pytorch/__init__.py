"""Determined's PyTorch Trial and Trainer API, off-cluster (``determined.pytorch``).

``from determined_launch import pytorch`` replaces ``from determined import pytorch``.
Importing this package imports torch; ``import determined_launch`` alone does not
(``det.pytorch`` loads it on first use).

The parts, one subpackage each: ``api`` (what users see: the trial, its context,
the Trainer, callbacks), ``loop`` (the training loop, its batch step and data
loaders), ``checkpoints`` (save, restore, the file format, loading a trial),
``data`` (DataLoader and batch helpers; the samplers stay at ``pytorch.samplers``),
``metrics`` (reducers, aggregation, validation, TensorBoard) and ``optim``
(wrapped models and optimizers, LR schedulers, gradient aggregation, AMP).
"""

# Re-exports only (Determined's names, public and the private ones its tests use).
# ruff: noqa: F401, I001

from determined_launch.pytorch._units import (
    Batch,
    Batches,
    Epoch,
    Epochs,
    TrainUnit,
    _TrainBoundary,
    _TrainBoundaryType,
)
from determined_launch.pytorch import samplers
from determined_launch.pytorch.data.loader import (
    DataLoader,
    TorchData,
    _Data,
    _dataset_repro_warning,
    adapt_batch_sampler,
    data_length,
    to_device,
)
from determined_launch.pytorch.api.callback import PyTorchCallback
from determined_launch.pytorch.optim.lr_scheduler import LRScheduler
from determined_launch.pytorch.metrics.reducer import (
    MetricReducer,
    Reducer,
    _PyTorchReducerContext,
    _SimpleReducer,
    _simple_reduce_metrics,
)
from determined_launch.pytorch.metrics.utils import (
    _combine_and_average_training_metrics,
    _convert_metrics_to_numpy,
    _prepare_metrics_reducers,
    _reduce_metrics,
)
from determined_launch.pytorch.metrics.tensorboard import _log_tb_metrics
from determined_launch.pytorch.api.context import PyTorchExperimentalContext, PyTorchTrialContext
from determined_launch.pytorch.api.trial import PyTorchTrial, _TrialState
from determined_launch.pytorch.loop.controller import _PyTorchTrialController, _ShouldExit
from determined_launch.pytorch.api.trainer import Trainer, init
from determined_launch.pytorch.checkpoints.load import (
    CheckpointLoadContext,
    load_trial_from_checkpoint_path,
)
