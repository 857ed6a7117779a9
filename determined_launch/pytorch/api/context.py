"""``PyTorchTrialContext``: what a ``PyTorchTrial`` receives.

Same constructor and methods as Determined 0.38.1 (see the spec, 2.3). It
owns two collaborators and passes calls on to them: ``optim.Optimization``
(``wrap_*``, ``backward``, ``step_optimizer``, AMP) and the metric reducers;
the seed-002 spellings are functions in ``api.seed002``.
"""

from __future__ import annotations

import functools
import logging
import pathlib
import tempfile
import types
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from determined_launch import errors
from determined_launch.pytorch.api import seed002
from determined_launch.pytorch.data.batch_sizes import calculate_batch_sizes
from determined_launch.pytorch.data.loader import _cpu_tensors, local_gpu
from determined_launch.pytorch.data.loader import to_device as _to_device
from determined_launch.pytorch.metrics.reducer import MetricReducer, _PyTorchReducerContext
from determined_launch.pytorch.optim import amp as _amp
from determined_launch.pytorch.optim.lr_scheduler import LRScheduler
from determined_launch.pytorch.optim.optimization import Optimization

logger = logging.getLogger("determined_launch.pytorch")


class PyTorchExperimentalContext:
    """``context.experimental``: AMP and the data-loader checks."""

    def __init__(self, parent: PyTorchTrialContext) -> None:
        self._parent = parent
        self._auto_to_device = True
        self._data_repro_checks_disabled = False

    def use_amp(self) -> None:
        """Automatic mixed precision: autocast forward passes, scale losses
        (disabled on CPU, as upstream). Call before ``wrap_model``."""
        self._parent.wrap_scaler(_amp.new_grad_scaler())
        self._parent._optim._use_amp = True
        logger.info("enabled automatic mixed precision (AMP)")

    def disable_dataset_reproducibility_checks(self) -> None:
        """Allow plain ``torch.utils.data.DataLoader``s (you handle sharding/resume)."""
        self._data_repro_checks_disabled = True

    def disable_auto_to_device(self) -> None:
        """Do not move batches to the device before ``train_batch``/``evaluate_batch``."""
        self._auto_to_device = False


def _passed_on(method: Callable[..., Any]) -> Any:
    """A context method that calls ``method`` on the context's ``Optimization``."""

    @functools.wraps(method)
    def call(self: PyTorchTrialContext, *args: Any, **kwargs: Any) -> Any:
        return method(self._optim, *args, **kwargs)

    return call


def _optim_state(name: str) -> Any:
    """A read-only view of the ``Optimization``'s attribute ``name`` (the private
    names upstream code and tests read on the context)."""
    return property(lambda self: getattr(self._optim, name))


class PyTorchTrialContext:
    """Context of one trial: distributed layout, hyperparameters, wrapped objects."""

    _scaler = _optim_state("_scaler")
    _use_amp = _optim_state("_use_amp")
    _use_apex = _optim_state("_use_apex")
    _use_horovod = _optim_state("_use_horovod")
    _main_model = _optim_state("_main_model")
    _aggregation_frequency = _optim_state("_aggregation_frequency")
    _is_pre_trainer = _optim_state("_is_pre_trainer")

    @property
    def _managed_training(self) -> bool:
        return bool(self._optim._managed_training)

    @_managed_training.setter
    def _managed_training(self, value: bool) -> None:  # Determined's tests set it
        self._optim._managed_training = value

    def __init__(
        self,
        core_context: Any,
        trial_seed: Optional[int],
        hparams: Optional[dict],
        slots_per_trial: int,
        num_gpus: int,
        exp_conf: Optional[dict[str, Any]],
        aggregation_frequency: int,
        steps_completed: int,
        managed_training: bool,
        debug_enabled: bool,
        enable_tensorboard_logging: bool = True,
    ) -> None:
        self._core = core_context
        self.distributed = core_context.distributed
        self._trial_seed = trial_seed
        self._hparams = hparams
        self._num_gpus = num_gpus
        self._exp_conf = exp_conf
        self._steps_completed = steps_completed
        self._debug_enabled = debug_enabled
        self._enable_tensorboard_logging = enable_tensorboard_logging
        self._slots_per_trial = slots_per_trial

        self._per_slot_batch_size: Optional[int] = None
        self._global_batch_size: Optional[int] = None
        if hparams and "global_batch_size" in hparams:
            self._per_slot_batch_size, self._global_batch_size = calculate_batch_sizes(
                hparams, self.distributed.size
            )

        self.device = self._pick_device(managed_training)
        self._on_cpu = self.device.type == "cpu"
        self._optim = Optimization(
            self.device, self.distributed, managed_training, aggregation_frequency
        )
        # Called every batch: the Optimization's own bound methods, one call less
        # than the class's pass-on (same signatures and behaviour).
        self.backward = self._optim.backward
        self.step_optimizer = self._optim.step_optimizer
        # The same lists the Optimization fills (wrap_model etc. append to them).
        self.models: list[nn.Module] = self._optim.models
        self.optimizers: list[torch.optim.Optimizer] = self._optim.optimizers
        self.lr_schedulers: list[LRScheduler] = self._optim.lr_schedulers

        self._epoch_len: Optional[int] = None
        #: the world size of the checkpoint this run resumed from, when it differs
        self._resized_from: Optional[int] = None
        self._batch_idx: Optional[int] = None
        self._stop_requested = False
        self._to_device_warned_types: set[type] = set()
        self._reducers = _PyTorchReducerContext(self.distributed.allgather)
        self._tbd_writer: Any = None
        self.profiler: Any = None
        self.experimental = PyTorchExperimentalContext(self)

    def _pick_device(self, managed_training: bool) -> torch.device:
        if not managed_training or self._num_gpus <= 0 or not torch.cuda.is_available():
            return torch.device("cpu")
        index = getattr(self.distributed, "local_rank", 0) if self.distributed.size > 1 else 0
        torch.cuda.set_device(local_gpu(index, getattr(self.distributed, "local_size", 1)))
        return torch.device("cuda", index)

    # ------------------------------------------------------------ configuration
    def get_global_batch_size(self) -> int:
        """Records per optimizer step across all ranks (``hparams["global_batch_size"]``)."""
        if self._global_batch_size is None:
            raise ValueError(
                "global_batch_size is undefined: pass hparams={'global_batch_size': N} to "
                "det.pytorch.init() to use get_global_batch_size()"
            )
        return self._global_batch_size

    def get_per_slot_batch_size(self) -> int:
        """Records per batch on this rank: global batch size // number of ranks."""
        if self._per_slot_batch_size is None:
            raise ValueError(
                "per-slot batch size is undefined: pass hparams={'global_batch_size': N} to "
                "det.pytorch.init() to use get_per_slot_batch_size()"
            )
        return self._per_slot_batch_size

    def get_experiment_config(self) -> dict[str, Any]:
        if self._exp_conf is None:
            raise ValueError("exp_conf is undefined: pass exp_conf= to det.pytorch.init()")
        return self._exp_conf

    def get_data_config(self) -> dict[str, Any]:
        return dict(self.get_experiment_config().get("data") or {})

    def get_hparams(self) -> dict[str, Any]:
        if self._hparams is None:
            raise ValueError("hparams is undefined: pass hparams= to det.pytorch.init()")
        return self._hparams

    def get_hparam(self, name: str) -> Any:
        hparams = self.get_hparams()
        if name == "global_batch_size":
            logger.warning(
                "Please use `context.get_per_slot_batch_size()` and "
                "`context.get_global_batch_size()` instead of accessing "
                "`global_batch_size` directly."
            )
        if name not in hparams:
            raise ValueError(
                f"Could not find name '{name}' in experiment hyperparameters "
                f"{sorted(hparams)}; check the spelling or add it to hparams"
            )
        return hparams[name]

    def get_trial_seed(self) -> int:
        if self._trial_seed is None:
            raise errors.InternalException("Trial seed not set.")
        return self._trial_seed

    def get_initial_batch(self) -> int:
        """The batch index training starts (or resumes) from."""
        return self._steps_completed

    def get_experiment_id(self) -> int:
        trial = getattr(getattr(self._core, "info", None), "trial", None)
        return int(getattr(trial, "experiment_id", None) or 0)

    def get_trial_id(self) -> int:
        trial = getattr(getattr(self._core, "info", None), "trial", None)
        return int(trial.trial_id) if trial is not None else 0

    def get_stop_requested(self) -> bool:
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask training to stop (with a checkpoint) at the next reporting boundary."""
        if not isinstance(stop_requested, bool):
            raise AssertionError("stop_requested must be a boolean")
        self._stop_requested = stop_requested

    # ------------------------------------------------------------ optimization
    @property
    def _current_batch_idx(self) -> Optional[int]:
        return self._batch_idx

    @_current_batch_idx.setter
    def _current_batch_idx(self, batch_idx: Optional[int]) -> None:
        self._batch_idx = batch_idx
        self._optim.start_batch(batch_idx)

    # Passed on to the Optimization (signatures and docs are its methods').
    wrap_model = _passed_on(Optimization.wrap_model)
    wrap_optimizer = _passed_on(Optimization.wrap_optimizer)
    wrap_lr_scheduler = _passed_on(Optimization.wrap_lr_scheduler)
    wrap_scaler = _passed_on(Optimization.wrap_scaler)
    configure_apex_amp = _passed_on(Optimization.configure_apex_amp)
    autocast_forward_pass = _passed_on(Optimization.autocast_forward_pass)
    backward = _passed_on(Optimization.backward)
    step_optimizer = _passed_on(Optimization.step_optimizer)
    _should_communicate_and_update = _passed_on(Optimization._should_communicate_and_update)
    _average_gradients = staticmethod(Optimization._average_gradients)
    _set_default_gradient_compression = _passed_on(
        Optimization._set_default_gradient_compression
    )
    _set_default_average_aggregated_gradients = _passed_on(
        Optimization._set_default_average_aggregated_gradients
    )
    _set_is_pre_trainer = _passed_on(Optimization._set_is_pre_trainer)

    # ------------------------------------------------------------ epochs and batches
    def _check_training_started(self, need_epoch_len: bool = True) -> None:
        if self._batch_idx is None:
            raise errors.InternalException("Training hasn't started.")
        if need_epoch_len and self._epoch_len is None:
            raise errors.InternalException("Training DataLoader uninitialized.")

    def is_epoch_start(self) -> bool:
        self._check_training_started()
        return self._batch_idx % self._epoch_len == 0  # type: ignore[operator]

    def is_epoch_end(self) -> bool:
        self._check_training_started()
        return (
            self._batch_idx % self._epoch_len  # type: ignore[operator]
            == self._epoch_len - 1  # type: ignore[operator]
        )

    def current_train_epoch(self) -> int:
        self._check_training_started()
        return self._batch_idx // self._epoch_len  # type: ignore[operator]

    def current_train_batch(self) -> int:
        self._check_training_started(need_epoch_len=False)
        return self._batch_idx  # type: ignore[return-value]

    # ------------------------------------------------------------ data
    def to_device(self, data: Any) -> Any:
        """Move tensors/arrays (nested in dicts, lists, tuples) to ``self.device``."""
        if self._on_cpu and _cpu_tensors(data):
            # The per-batch common case: nothing to move (a new list or dict, as
            # the general path returns).
            kind = type(data)
            return list(data) if kind is list else dict(data) if kind is dict else data
        return _to_device(data, self.device, self._to_device_warned_types)

    # ------------------------------------------------------------ reducers
    def wrap_reducer(
        self,
        reducer: Union[Callable, MetricReducer],
        name: Optional[str] = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> MetricReducer:
        return self._reducers.wrap_reducer(reducer, name, for_training, for_validation)

    def reduce_metrics(self, for_training: bool) -> dict[str, Any]:
        return self._reducers.reduce_metrics(for_training)

    def reset_reducers(self) -> None:
        self._reducers.reset_reducers()

    # ------------------------------------------------------------ tensorboard
    def get_enable_tensorboard_logging(self) -> bool:
        return self._enable_tensorboard_logging

    def set_enable_tensorboard_logging(self, enable_tensorboard_logging: bool) -> None:
        self._enable_tensorboard_logging = enable_tensorboard_logging

    def get_tensorboard_path(self) -> pathlib.Path:
        """``<run_dir>/tensorboard`` (FIX-7: never inside the code copy)."""
        train = getattr(self._core, "train", None)
        if train is not None and hasattr(train, "get_tensorboard_path"):
            return pathlib.Path(train.get_tensorboard_path())
        explicit = getattr(self._core, "tensorboard_path", None)
        if explicit:
            return pathlib.Path(explicit)
        run_dir = getattr(self._core, "run_dir", None)
        if run_dir is None:
            return pathlib.Path(tempfile.gettempdir(), "det-tensorboard")
        return pathlib.Path(run_dir, "tensorboard")

    def get_tensorboard_writer(self) -> Any:
        """A ``SummaryWriter`` on ``get_tensorboard_path()``; a no-op writer when
        tensorboard is not installed."""
        if self._tbd_writer is None:
            from determined_launch.pytorch.metrics import tensorboard as _tensorboard

            path = type(self).get_tensorboard_path(self)
            writer = _tensorboard.make_writer(path) if self.distributed.rank == 0 else None
            self._tbd_writer = writer if writer is not None else _tensorboard.NullWriter()
        return self._tbd_writer

    def _maybe_reset_tbd_writer(self) -> None:
        """Flush (and close) the writer so event files are complete on disk."""
        from determined_launch.pytorch.metrics.tensorboard import NullWriter

        if self._tbd_writer is not None and not isinstance(self._tbd_writer, NullWriter):
            self._tbd_writer.close()
            self._tbd_writer = None

    def _publish_tensorboard(self, *, final: bool = False) -> None:
        """After each report, and ``final``-ly at exit (chief): flush the event
        files and sync what changed (the Trainer's and the user's writer's
        files) to object storage, as core's AUTO mode would; core itself runs
        in MANUAL mode so that it does not write every metric a second time."""
        if self.distributed.rank != 0:
            return
        flush = getattr(self._tbd_writer, "flush", None)
        if flush is not None:
            flush()
        sync = getattr(getattr(self._core, "train", None), "_sync_tensorboard", None)
        if sync is not None:
            sync(force=final)

    def set_profiler(self, *args: Any, **kwargs: Any) -> None:
        """``torch.profiler.profile(*args, **kwargs)`` run around each training batch,
        traces written to the TensorBoard directory."""
        path = str(type(self).get_tensorboard_path(self))
        self.profiler = torch.profiler.profile(
            *args, on_trace_ready=torch.profiler.tensorboard_trace_handler(path), **kwargs
        )

    # ------------------------------------------------------------ seed 002 (api.seed002)
    @property
    def training(self) -> types.SimpleNamespace:
        """``ctx.training.hparams`` (seed 002) = ``ctx.get_hparams()``."""
        return types.SimpleNamespace(hparams=self.get_hparams())

    hparams = property(seed002.hparams)
    config_data = property(seed002.config_data)

    build_trial = seed002.build_trial
    train = seed002.train
    fit = seed002.fit
    load_checkpoint_trial = seed002.load_checkpoint_trial
    predict = seed002.predict
