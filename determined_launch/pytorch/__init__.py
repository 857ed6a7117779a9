"""Determined's PyTorch Trial and Trainer API, off-cluster (``determined.pytorch``).

``from determined_launch import pytorch`` replaces ``from determined import pytorch``.
Importing this package imports torch; ``import determined_launch`` alone does not
(``det.pytorch`` loads it on first use).
"""

# Re-exports only; three groups of modules append their lines here, so the
# unused-import and import-order checks are off for this file.
# ruff: noqa: F401, I001

# --- units, data, samplers, reducers, LR scheduler, callbacks, TB/progress (H1) ---
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
from determined_launch.pytorch._data import (
    DataLoader,
    TorchData,
    _Data,
    _dataset_repro_warning,
    adapt_batch_sampler,
    data_length,
    to_device,
)
from determined_launch.pytorch._callback import PyTorchCallback
from determined_launch.pytorch._lr_scheduler import LRScheduler
from determined_launch.pytorch._reducer import (
    MetricReducer,
    Reducer,
    _PyTorchReducerContext,
    _SimpleReducer,
    _simple_reduce_metrics,
)
from determined_launch.pytorch._metric_utils import (
    _combine_and_average_training_metrics,
    _convert_metrics_to_numpy,
    _prepare_metrics_reducers,
    _reduce_metrics,
)
from determined_launch.pytorch._tensorboard import _log_tb_metrics
# --- end H1 ---
# --- context, trial, controller, trainer (H2) ---
from determined_launch.pytorch._context import PyTorchExperimentalContext, PyTorchTrialContext
from determined_launch.pytorch._trial import PyTorchTrial, _TrialState
from determined_launch.pytorch._controller import _PyTorchTrialController, _ShouldExit
from determined_launch.pytorch._trainer import Trainer, init
# --- end H2 ---
# --- checkpoint loading (H3) ---
from determined_launch.pytorch._load import CheckpointLoadContext, load_trial_from_checkpoint_path
# --- end H3 ---
