"""``_PyTorchTrialController``: the training loop behind ``Trainer.fit``.

The loop trains batch after batch until a boundary (max_length, validation,
checkpoint or reporting period) is reached; that ends a "workload": training
metrics are aggregated and reported, then each reached boundary is acted on
in order (spec 3.3/3.4). Validation lives in ``_ctl_validation``, checkpoint
save/restore in ``_ctl_checkpoint``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import torch

from determined_launch import errors
from determined_launch._user import InvalidHP
from determined_launch.pytorch import _units
from determined_launch.pytorch._callback import (
    PyTorchCallback,
    _epoch_start_takes_no_index,
    _overrides,
)
from determined_launch.pytorch._ctl_batch import _BatchMixin
from determined_launch.pytorch._ctl_checkpoint import _CheckpointMixin
from determined_launch.pytorch._ctl_metrics import _MetricsMixin
from determined_launch.pytorch._data import DataLoader, _dataset_repro_warning
from determined_launch.pytorch._progress import Progress
from determined_launch.pytorch._trial import (
    PyTorchTrial,
    _evaluate_batch_defined,
    _evaluate_full_dataset_defined,
    _TrialState,
)
from determined_launch.pytorch._units import TrainUnit, _TrainBoundary, _TrainBoundaryType

logger = logging.getLogger("determined_launch.pytorch")


class _ShouldExit(Exception):
    """Stop training now (preemption or stop request); checkpoint unless told not to."""

    def __init__(self, skip_exit_checkpoint: bool = False) -> None:
        super().__init__()
        self.skip_exit_checkpoint = skip_exit_checkpoint


class _PyTorchTrialController(_BatchMixin, _MetricsMixin, _CheckpointMixin):
    def __init__(
        self,
        trial_inst: PyTorchTrial,
        context: Any,
        checkpoint_period: TrainUnit,
        validation_period: TrainUnit,
        reporting_period: TrainUnit,
        smaller_is_better: bool,
        steps_completed: int,
        latest_checkpoint: Optional[str],
        local_training: bool,
        test_mode: bool,
        searcher_metric_name: Optional[str],
        checkpoint_policy: str,
        step_zero_validation: bool,
        max_length: TrainUnit,
        global_batch_size: Optional[int],
        profiling_enabled: Optional[bool],
    ) -> None:
        if not isinstance(trial_inst, PyTorchTrial):
            raise TypeError("_PyTorchTrialController requires a PyTorchTrial.")
        self.trial = trial_inst
        self.context = context
        self.core_context = context._core
        self.callbacks: dict[str, PyTorchCallback] = self.trial.build_callbacks()
        for callback in self.callbacks.values():
            if _overrides(callback, "on_checkpoint_end"):
                warnings.warn(
                    "The on_checkpoint_end callback is deprecated, please use "
                    "on_checkpoint_write_end instead.",
                    FutureWarning,
                    stacklevel=2,
                )
        if not self.context.models:
            raise errors.InvalidExperimentException(
                "Must have at least one model. "
                "This might be caused by not wrapping your model with wrap_model()."
            )
        if not self.context.optimizers:
            raise errors.InvalidExperimentException(
                "Must have at least one optimizer. "
                "This might be caused by not wrapping your optimizer with wrap_optimizer()."
            )
        self._check_evaluate_implementation()
        if self.context.distributed.size > 1 and not (
            torch.distributed.is_available() and torch.distributed.is_initialized()
        ) and not self.context._use_horovod:
            raise errors.InvalidExperimentException(
                f"{self.context.distributed.size} ranks but no torch process group: run under "
                "`det-launch torch --` or torchrun and create the context with "
                "det.pytorch.init() (it starts the process group), or call "
                "torch.distributed.init_process_group() yourself"
            )

        self.is_chief = self.context.distributed.rank == 0
        self.checkpoint_period = checkpoint_period
        self.validation_period = validation_period
        self.reporting_period = reporting_period
        self.smaller_is_better = smaller_is_better
        self.steps_completed = steps_completed
        self.latest_checkpoint = latest_checkpoint
        self.local_training = local_training
        self.test_mode = test_mode
        self.searcher_metric_name = searcher_metric_name
        self.ckpt_policy = checkpoint_policy
        self.step_zero_validation = step_zero_validation
        self.max_length = max_length
        self.global_batch_size = global_batch_size
        self.profiling_enabled = bool(profiling_enabled)

        self.trial_id = self.context.get_trial_id()
        self.state = _TrialState(trial_id=self.trial_id)
        self.training_loader: Any = None
        self.validation_loader: Any = None
        self.training_iterator: Optional[Iterator[Any]] = None
        self.last_validation_metrics: Optional[dict[str, Any]] = None
        self._preempt_polled = False
        self._progress = Progress(max_length, is_chief=self.is_chief)
        self._warned_nan = False
        self._legacy_epoch_start = {
            name: _epoch_start_takes_no_index(cb) for name, cb in self.callbacks.items()
        }

    # ------------------------------------------------------------ class hooks
    @classmethod
    def pre_execute_hook(cls, trial_seed: int, distributed_backend: Any) -> None:
        """Start the distributed backend the environment asks for, then seed."""
        if distributed_backend.use_torch() and not torch.distributed.is_initialized():
            torch.distributed.init_process_group(
                backend="nccl" if torch.cuda.is_available() else "gloo"
            )
        cls._set_random_seeds(trial_seed)

    @classmethod
    def _set_random_seeds(cls, seed: int) -> None:
        # Same seed on every rank: models start identical; data sharding (not
        # the RNG) makes the ranks see different records.
        random.seed(seed)
        np.random.seed(seed)
        torch.random.manual_seed(seed)

    def _check_evaluate_implementation(self) -> None:
        if _evaluate_batch_defined(self.trial) == _evaluate_full_dataset_defined(self.trial):
            raise errors.InvalidExperimentException(
                "Please define exactly one of: `evaluate_batch()` or `evaluate_full_dataset()`. "
                "For most use cases `evaluate_batch()` is recommended because "
                "it can be parallelized across all devices."
            )

    # ------------------------------------------------------------ data loaders
    def _checked_loader(self, data: Any, builder: str) -> Any:
        """A torch loader from a non-det loader, after the reproducibility check."""
        if not self.context.experimental._data_repro_checks_disabled:
            raise RuntimeError(_dataset_repro_warning(builder, data))
        return data

    def _set_data_loaders(self) -> None:
        dist = self.context.distributed
        seed = self.context._trial_seed
        train_data = self.trial.build_training_data_loader()
        if isinstance(train_data, DataLoader):
            self.training_loader = train_data.get_data_loader(
                repeat=True, skip=self.steps_completed, num_replicas=dist.size, rank=dist.rank,
                seed=seed,
            )
        else:
            self.training_loader = self._checked_loader(train_data, "build_training_data_loader")
        try:
            epoch_len = len(self.training_loader)
        except TypeError:
            epoch_len = sys.maxsize
        epoch_len = dist.broadcast(epoch_len)
        if epoch_len < 1:
            raise ValueError(
                "the training data loader is empty (0 batches per rank): give the dataset at "
                "least global_batch_size records (and drop_last=False if it is shorter)"
            )
        self.context._epoch_len = epoch_len

        self.validation_loader = None
        val_data = self.trial.build_validation_data_loader()
        sharded = _evaluate_batch_defined(self.trial)
        if isinstance(val_data, DataLoader):
            if sharded:
                self.validation_loader = val_data.get_data_loader(
                    repeat=False, skip=0, num_replicas=dist.size, rank=dist.rank, seed=seed
                )
            elif self.is_chief:
                self.validation_loader = val_data.get_data_loader(
                    repeat=False, skip=0, num_replicas=1, rank=0, seed=seed
                )
        elif sharded or self.is_chief:
            self.validation_loader = self._checked_loader(val_data, "build_validation_data_loader")

    def _training_batches(self) -> Iterator[Any]:
        """The training iterator, re-iterated when a finite custom loader ends
        (FIX-13: upstream would stop yielding and spin)."""
        iterator = self.training_iterator
        while True:
            yielded = False
            for batch in iterator:  # type: ignore[union-attr]
                yielded = True
                yield batch
            if not yielded:
                raise ValueError(
                    "the training data loader yielded no batches; give it at least one batch"
                )
            iterator = iter(self.training_loader)

    # ------------------------------------------------------------ run
    def run(self) -> None:
        self.steps_completed = self._resume_offset()
        self.context._steps_completed = self.steps_completed
        with contextlib.ExitStack() as exit_stack:
            for callback in self.callbacks.values():
                callback.on_trial_startup(self.steps_completed, self.latest_checkpoint)
                exit_stack.callback(callback.on_trial_shutdown)
            self._set_data_loaders()
            # Created before restoring, as upstream, so that restoring the RNG
            # state is the last thing that touches it.
            self.training_iterator = iter(self.training_loader)
            exit_stack.callback(self._cleanup_iterator)
            if self.latest_checkpoint is not None:
                logger.info("Restoring trial from checkpoint %s", self.latest_checkpoint)
                with self._restore_path(self.latest_checkpoint) as load_path:
                    self._load(load_path)
            if self.context._use_horovod:
                self._broadcast_horovod_state()
            for callback in self.callbacks.values():
                callback.on_training_start()
            if self.profiling_enabled:
                logger.warning("profiling_enabled: system profiling needs a Determined master; "
                               "use context.set_profiler() for torch traces")
            self._progress = Progress(
                self.max_length, is_chief=self.is_chief, start_batch=self.state.batches_trained,
                start_epoch=self.state.epochs_trained, epoch_len=self.context._epoch_len,
            )
            exit_stack.callback(self._progress.close)
            self._run()

    def _broadcast_horovod_state(self) -> None:
        """Horovod ranks start from the chief's (possibly restored) weights."""
        import horovod.torch as hvd

        hvd.broadcast_parameters(self.context._main_model.state_dict(), root_rank=0)
        for optimizer in self.context.optimizers:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def _cleanup_iterator(self) -> None:
        # Shuts down DataLoader workers now rather than at garbage collection.
        self.training_iterator = None

    def _run(self) -> None:
        try:
            if (
                self.step_zero_validation
                and self.state.batches_trained == 0
                and self.state.last_val == 0
                and self.last_validation_metrics is None
            ):
                self._validate()
            boundaries = [
                _TrainBoundary(_TrainBoundaryType.TRAIN, self.max_length),
                _TrainBoundary(_TrainBoundaryType.VALIDATE, self.validation_period),
                _TrainBoundary(_TrainBoundaryType.CHECKPOINT, self.checkpoint_period),
                _TrainBoundary(_TrainBoundaryType.REPORT, self.reporting_period),
            ]
            enumerator = enumerate(self._training_batches(), start=self.steps_completed)
            while _units.remaining(
                self.max_length, self.state.batches_trained, self.state.epochs_trained
            ) > 0:
                boundaries, per_batch = self._train_with_boundaries(enumerator, boundaries)
                self._end_workload(per_batch)
                self._act_on_boundaries(boundaries)
                if self.test_mode:  # one batch, then the final validation and checkpoint
                    break
            if not self._validation_is_current():
                self._validate()
            if not self._checkpoint_is_current():
                self._checkpoint(already_exiting=False)
        except _ShouldExit as e:
            if not e.skip_exit_checkpoint and not self._checkpoint_is_current():
                self._checkpoint(already_exiting=True)
            logger.info("training stopped at batch %d (%s)", self.state.batches_trained,
                        "preempted" if self._preempt_polled else "stop requested")
        except InvalidHP as e:
            logger.info("InvalidHP raised by the trial: %s; saving a checkpoint and stopping", e)
            if not self._checkpoint_is_current():
                self._checkpoint(already_exiting=True)
            raise

    def _act_on_boundaries(self, boundaries: list[_TrainBoundary]) -> None:
        reported = False
        for boundary in boundaries:
            if not boundary.limit_reached:
                continue
            kind = boundary.step_type
            if kind in (_TrainBoundaryType.TRAIN, _TrainBoundaryType.REPORT):
                if not reported and self.is_chief:
                    self.core_context.train.report_progress(
                        progress=_units.progress(
                            self.max_length, self.state.batches_trained, self.state.epochs_trained
                        )
                    )
                reported = True
            elif kind is _TrainBoundaryType.VALIDATE:
                if not self._validation_is_current():
                    self._validate()
            elif kind is _TrainBoundaryType.CHECKPOINT:
                if not self._checkpoint_is_current():
                    self._checkpoint(already_exiting=False)
            boundary.limit_reached = False
            if self.context.get_enable_tensorboard_logging():
                self._upload_tb_files()
            self._stop_check()
        if self._preempt_polled:
            self._stop_check()

    def _stop_check(self) -> None:
        if self.context.get_stop_requested():
            raise _ShouldExit()
        # Same call sequence on every rank, so every rank gets the same answer.
        if self.core_context.preempt.should_preempt():
            self._preempt_polled = True
            raise _ShouldExit()

    def _upload_tb_files(self) -> None:
        """Event files are written in place (the run directory); just flush."""
        writer = self.context._tbd_writer
        if writer is not None and hasattr(writer, "flush"):
            writer.flush()

    # ------------------------------------------------------------ training
    def _train_with_boundaries(
        self, training_enumerator: Iterator[tuple[int, Any]], train_boundaries: list[_TrainBoundary]
    ) -> tuple[list[_TrainBoundary], list[dict[str, Any]]]:
        """Train until a boundary is reached; returns the boundaries (with
        ``limit_reached`` set) and the per-batch metrics of this workload."""
        for model in self.context.models:
            model.train()
        self.context.reset_reducers()
        epoch_len = self.context._epoch_len
        preempt = self.core_context.preempt
        per_batch: list[dict[str, Any]] = []
        for batch_idx, batch in training_enumerator:
            epoch_idx, in_epoch = divmod(batch_idx, epoch_len)
            if in_epoch == 0:
                self._on_epoch_start(epoch_idx)
            metrics = self._train_batch(batch, epoch_idx, batch_idx)
            if per_batch and metrics.keys() != per_batch[0].keys():
                raise ValueError(
                    f"train_batch returned metric keys {sorted(metrics)} at batch {batch_idx} "
                    f"but {sorted(per_batch[0])} earlier; return the same keys every batch"
                )
            per_batch.append(metrics)
            self.state.batches_trained += 1
            self._progress.batch_done(self.state.batches_trained, self.state.epochs_trained)
            if in_epoch == epoch_len - 1:
                for callback in self.callbacks.values():
                    callback.on_training_epoch_end(epoch_idx)
                self.state.epochs_trained += 1
            reached = _units.check_boundaries(
                train_boundaries, batch_idx, epoch_len, test_mode=self.test_mode
            )
            # FIX-12: a cheap, rank-synchronized poll every batch, so a
            # preemption lands within about a batch, not a reporting period.
            if preempt.should_preempt(block=False):
                self._preempt_polled = True
                reached = True
            if reached:
                break
        return train_boundaries, per_batch


# The trial's default controller. Bound here, above the trial, so that the
# trial module never imports the controller that drives it.
PyTorchTrial.trial_controller_class = _PyTorchTrialController
