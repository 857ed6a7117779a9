"""``_PyTorchTrialController``: the training loop behind ``Trainer.fit``.

The loop trains batch after batch until a boundary (max_length, validation,
checkpoint or reporting period) is reached; that ends a "workload": training
metrics are aggregated and reported, then each reached boundary is acted on
in order (spec 3.3/3.4). It owns the trial's counters (``state``) and four
collaborators, each with its own state: ``BatchStep`` (the per-batch loop,
run in segments between boundaries), ``TrainingMetrics`` (a workload's
metrics), ``Validator`` (with the ``CheckpointPolicy``) and ``Checkpointer``
(save/restore). The context owns the fifth, ``Optimization``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import warnings
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import torch

from determined_launch._user import InvalidHP
from determined_launch.pytorch import _units
from determined_launch.pytorch._units import TrainUnit, _TrainBoundary, _TrainBoundaryType
from determined_launch.pytorch.api.callback import PyTorchCallback, _overrides
from determined_launch.pytorch.api.trial import (
    PyTorchTrial,
    _TrialState,
)
from determined_launch.pytorch.checkpoints.checkpointer import Checkpointer
from determined_launch.pytorch.checkpoints.policy import CheckpointPolicy
from determined_launch.pytorch.loop.batch_step import BatchStep, check_metric_keys
from determined_launch.pytorch.loop.loaders import build_loaders, check_setup, enumerated
from determined_launch.pytorch.loop.progress import Progress
from determined_launch.pytorch.metrics.training import TrainingMetrics
from determined_launch.pytorch.metrics.validation import Validator

logger = logging.getLogger("determined_launch.pytorch")


class _ShouldExit(Exception):
    """Stop training now (preemption or stop request); checkpoint unless told not to."""

    def __init__(self, skip_exit_checkpoint: bool = False) -> None:
        super().__init__()
        self.skip_exit_checkpoint = skip_exit_checkpoint


class _PyTorchTrialController:
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
        check_setup(self.trial, self.context)

        self.is_chief = self.context.distributed.rank == 0
        self.checkpoint_period = checkpoint_period
        self.validation_period = validation_period
        self.reporting_period = reporting_period
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
        self.training_iterator: Iterator[Any] = iter(())
        self.last_validation_metrics: Optional[dict[str, Any]] = None
        self._preempt_polled = False
        self._next_batch = steps_completed  # the index of the next batch to train
        self._progress = Progress(max_length, is_chief=self.is_chief)

        self.batch_step = BatchStep(self.trial, self.context, self.callbacks)
        self.training_metrics = TrainingMetrics(self.context, self.core_context, self.callbacks)
        self.checkpoint_policy = CheckpointPolicy(
            checkpoint_policy, searcher_metric_name, smaller_is_better, self.core_context
        )
        self.validator = Validator(
            self.trial, self.context, self.core_context, self.callbacks,
            self.checkpoint_policy, test_mode,
        )
        self.checkpointer = Checkpointer(
            self.trial, self.context, self.core_context, self.callbacks, self.trial_id
        )
        self.latest_storage_id: Optional[str] = None

    @property
    def smaller_is_better(self) -> bool:  # Determined's tests set it on the controller
        return self.checkpoint_policy.smaller_is_better

    @smaller_is_better.setter
    def smaller_is_better(self, value: bool) -> None:
        self.checkpoint_policy.smaller_is_better = value

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

    # ------------------------------------------------------------ data loaders
    def _set_data_loaders(self) -> None:
        self.training_loader, self.validation_loader = build_loaders(
            self.trial, self.context, self.steps_completed
        )

    # ------------------------------------------------------------ run
    def run(self) -> None:
        self.steps_completed = self.checkpointer.resume_offset(
            self.latest_checkpoint, self.steps_completed
        )
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
                with self.checkpointer.restore_path(self.latest_checkpoint) as load_path:
                    self._load(load_path)
            if self.context._use_horovod:
                self._broadcast_horovod_state()
            for callback in self.callbacks.values():
                callback.on_training_start()
            if self.profiling_enabled:  # system metrics, one sample a second (core/_profiler.py)
                self.core_context.profiler.on(sampling_interval=1, samples_per_report=10)
                exit_stack.callback(self.core_context.profiler.off)
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
        self.training_iterator = iter(())

    # ------------------------------------------------------------ collaborators
    # The names Determined's tests call on the controller, passed on.
    def _end_workload(self, per_batch: list[dict[str, Any]]) -> dict[str, Any]:
        return self.training_metrics.end_workload(
            per_batch, self.state.batches_trained, self.state.epochs_trained, self._progress
        )

    def _validation_is_current(self) -> bool:
        return bool(self.state.last_val == self.state.batches_trained)

    def _validate(self, searcher_op: Any = None) -> dict[str, Any]:
        """Validate; checkpoint too when the checkpoint policy asks for it."""
        metrics, should_checkpoint = self.validator.validate(
            self.validation_loader, self.state, self._progress, self._checkpoint_is_current
        )
        self.last_validation_metrics = metrics
        if should_checkpoint:
            self._checkpoint(already_exiting=False)
        return metrics

    def _checkpoint_is_current(self) -> bool:
        return bool(self.state.last_ckpt == self.state.batches_trained)

    def _checkpoint(self, already_exiting: bool) -> None:
        self.latest_storage_id = self.checkpointer.save(self.state, already_exiting)

    def _load(self, load_path: Any) -> None:
        self.checkpointer.trial_id = self.trial_id  # Determined's tests set it on the controller
        self.state = self.checkpointer.load(load_path)

    # ------------------------------------------------------------ the loop
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
            self._next_batch = self.steps_completed
            while _units.remaining(
                self.max_length, self.state.batches_trained, self.state.epochs_trained
            ) > 0:
                boundaries, per_batch = self._train_segments(boundaries)
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
        self, training_enumerator: Optional[Iterator[tuple[int, Any]]],
        train_boundaries: list[_TrainBoundary],
    ) -> tuple[list[_TrainBoundary], list[dict[str, Any]]]:
        """Determined's seam, which its tests drive: ``_train_segments`` on the
        ``(batch_idx, batch)`` pairs of ``training_enumerator`` (None: the loop's own)."""
        if training_enumerator is None:
            return self._train_segments(train_boundaries)
        own = self.training_iterator
        start, self.training_iterator = enumerated(training_enumerator)
        self._next_batch = self._next_batch if start is None else start
        wrapped = self.training_iterator
        try:
            return self._train_segments(train_boundaries)
        finally:
            if self.training_iterator is wrapped:  # not restarted: the pairs' source goes on
                self.training_iterator = own

    def _train_segments(self, train_boundaries: list[_TrainBoundary]
                        ) -> tuple[list[_TrainBoundary], list[dict[str, Any]]]:
        """Train until a boundary is reached; returns the boundaries (with
        ``limit_reached`` set) and the per-batch metrics of this workload. Batches
        run in segments (``BatchStep.run``, a flat loop) up to the next count where
        a boundary can be reached or the epoch's end; the epoch callbacks,
        counters and boundary tests run between segments, not per batch."""
        for model in self.context.models:
            model.train()
        self.context.reset_reducers()
        epoch_len = self.context._epoch_len
        # FIX-12: a cheap, rank-synchronized poll every batch, so a preemption
        # lands within about a batch, not a reporting period.
        preempt = self.core_context.preempt
        step = self.batch_step
        state = self.state
        progress = self._progress
        batch_done = None
        if progress.draws:  # no bar: no call
            offset = state.batches_trained - self._next_batch

            def batch_done(batch_idx: int) -> None:
                progress.batch_done(batch_idx + offset, state.epochs_trained)

        test_mode = self.test_mode
        first = batch_idx = self._next_batch
        per_batch: list[dict[str, Any]] = []
        reached = False
        while not reached:
            epoch_idx, in_epoch = divmod(batch_idx, epoch_len)
            stop = min(
                _units.next_boundary(train_boundaries, batch_idx, epoch_len, test_mode=test_mode),
                batch_idx - in_epoch + epoch_len,
            )
            if in_epoch == 0:
                step.epoch_start(epoch_idx)
            done = len(per_batch)
            try:
                end, self.training_iterator, polled = step.run(
                    self.training_iterator, self.training_loader, epoch_idx, batch_idx, stop,
                    per_batch, preempt, batch_done,
                )
            except BaseException:  # e.g. InvalidHP: the exit checkpoint counts what ran
                state.batches_trained += len(per_batch) - done
                raise
            state.batches_trained += end - batch_idx
            batch_idx = end
            if end % epoch_len == 0:
                step.epoch_end(epoch_idx)
                state.epochs_trained += 1
            reached = _units.check_boundaries(train_boundaries, end - 1, epoch_len,
                                              test_mode=test_mode)
            if polled:
                self._preempt_polled = reached = True
        self._next_batch = batch_idx
        check_metric_keys(per_batch, first)
        return train_boundaries, per_batch


# The trial's default controller. Bound here, above the trial, so that the
# trial module never imports the controller that drives it.
PyTorchTrial.trial_controller_class = _PyTorchTrialController
