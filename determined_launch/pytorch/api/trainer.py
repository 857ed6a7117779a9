"""``det.pytorch.init()`` and ``Trainer``: run a ``PyTorchTrial`` anywhere.

Differences from Determined 0.38.1, each fixing a defect (spec section 6):
``init`` always seeds every RNG (FIX-6) and starts the torch process group
itself under our launchers and torchrun (FIX-8); ``fit(latest_checkpoint=)``
also takes a directory or ``"latest"`` (FIX-10).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import socket
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Optional

import torch

from determined_launch import core, envvars
from determined_launch._user import show_info_logs
from determined_launch.cluster.info import NoHParams
from determined_launch.core._context import resolve_info
from determined_launch.core.distributed import DistributedContext
from determined_launch.pytorch._units import Batch, Epoch, TrainUnit
from determined_launch.pytorch.api import seed002
from determined_launch.pytorch.api.context import PyTorchTrialContext
from determined_launch.pytorch.api.seed002 import _InitHandle
from determined_launch.pytorch.api.trial import PyTorchTrial
from determined_launch.pytorch.checkpoints.files import find_state_file
from determined_launch.pytorch.data.batch_sizes import shard_batch_size
from determined_launch.pytorch.data.loader import local_gpu
from determined_launch.pytorch.loop.teardown import end_process_group

logger = logging.getLogger("determined_launch.pytorch")

_POLICIES = ("best", "all", "none")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _start_process_group(dist: DistributedContext) -> bool:
    """Start torch.distributed (gloo on CPU, nccl on GPU) if nobody has; True if
    we started it. Without MASTER_ADDR/MASTER_PORT (per-slot launchers) the
    chief picks a port and shares it over the DistributedContext."""
    if torch.distributed.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(local_gpu(dist.local_rank, dist.local_size))
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        init_method = "env://"
    else:
        port = dist.broadcast(_free_port() if dist.rank == 0 else None)
        host = dist.chief_ip or "127.0.0.1"
        init_method = f"tcp://{host}:{port}"
    torch.distributed.init_process_group(
        backend, init_method=init_method, rank=dist.rank, world_size=dist.size
    )
    logger.info("started torch.distributed (%s) with %d ranks", backend, dist.size)
    return True


def _auto_distributed() -> tuple[Optional[DistributedContext], bool]:
    """FIX-8: the DistributedContext (and process group) the environment implies."""
    if _env_true("USE_HOROVOD"):
        import horovod.torch as hvd

        hvd.init()
        return DistributedContext.from_horovod(hvd), False
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if not world.isdigit() or int(world) <= 1:
        return None, False
    if os.environ.get("LOCAL_WORLD_SIZE"):
        dist = DistributedContext.from_torch_distributed()
    else:
        dist = DistributedContext.from_env()
    return dist, _start_process_group(dist)


def _resolve_seed(info: Any, seed: Optional[int], exp_conf: Optional[dict[str, Any]],
                  dist: Any) -> int:
    """FIX-6: trial seed, else ``seed=``, else the config's experiment_seed, else
    a random one (the chief's, shared, logged and saved in checkpoints)."""
    if info.trial is not None and not info.trial.local:  # the local trial's seed is a default
        return int(info.trial.trial_seed)
    if seed is not None:
        return int(seed)
    conf_seed = ((exp_conf or {}).get("reproducibility") or {}).get("experiment_seed")
    if conf_seed is not None:
        return int(conf_seed)
    chosen = random.SystemRandom().randrange(2**31) if dist.rank == 0 else None
    chosen = int(dist.broadcast(chosen)) if dist.size > 1 else int(chosen or 0)
    logger.info("no seed given; using random trial seed %d (pass init(seed=...) to repeat)",
                chosen)
    return chosen


@contextlib.contextmanager
def _init(
    *,
    hparams: Optional[dict[str, Any]] = None,
    exp_conf: Optional[dict[str, Any]] = None,
    distributed: Optional[core.DistributedContext] = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
    checkpoint_storage: Optional[str] = None,
    run_dir: Optional[str] = None,
    tensorboard_path: Optional[str] = None,
    seed: Optional[int] = None,
) -> Iterator[PyTorchTrialContext]:
    show_info_logs()  # `python train.py` shows its progress lines
    info = resolve_info()
    if hparams is None and info.trial is not None:
        # A superset of upstream (which leaves hparams unset): the trial's own; a
        # bare run's empty NoHParams stays one, whose missing key names the fix.
        given = info.trial.hparams
        hparams = given if isinstance(given, NoHParams) else dict(given)
    started_pg = False
    if distributed is None:
        distributed, started_pg = _auto_distributed()
    context: Optional[PyTorchTrialContext] = None
    try:
        core_context = core.init(
            distributed=distributed,
            checkpoint_storage=checkpoint_storage,
            run_dir=run_dir,
            preempt_mode=core.PreemptMode.WorkersAskChief,
            # The Trainer writes its own scalars (Determined/<name>) when
            # enable_tensorboard_logging is on and syncs them after each report
            # (context._publish_tensorboard); AUTO would write every metric a
            # second time, even with logging off (upstream passes MANUAL too).
            tensorboard_mode=core.TensorboardMode.MANUAL,
            info=info,
        )
        core_context.tensorboard_path = tensorboard_path  # type: ignore[attr-defined]
        core_context.train.log_reports = False  # one line per report: the Trainer's own
        with core_context:
            dist = core_context.distributed
            trial_seed = _resolve_seed(info, seed, exp_conf, dist)
            from determined_launch.pytorch.loop.controller import _PyTorchTrialController

            _PyTorchTrialController._set_random_seeds(trial_seed)
            num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            context = PyTorchTrialContext(
                core_context=core_context,
                trial_seed=trial_seed,
                hparams=hparams,
                slots_per_trial=dist.size,
                num_gpus=num_gpus,
                exp_conf=exp_conf,
                aggregation_frequency=aggregation_frequency,
                steps_completed=0,
                managed_training=True,
                debug_enabled=False,
                enable_tensorboard_logging=enable_tensorboard_logging,
            )
            dist.shard_batch_size = functools.partial(  # type: ignore[attr-defined]
                shard_batch_size, dist.size
            )
            try:
                yield context
            finally:
                context._maybe_reset_tbd_writer()
                context._publish_tensorboard(final=True)
    except BaseException:
        if started_pg:  # no barrier: a peer that failed would never arrive
            end_process_group(barrier=False, models=context.models if context is not None else ())
        raise
    if started_pg:
        end_process_group(barrier=True, models=context.models if context is not None else ())


def init(
    *,
    hparams: Optional[dict[str, Any]] = None,
    exp_conf: Optional[dict[str, Any]] = None,
    distributed: Optional[core.DistributedContext] = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
    checkpoint_storage: Optional[str] = None,
    run_dir: Optional[str] = None,
    tensorboard_path: Optional[str] = None,
    seed: Optional[int] = None,
) -> Any:
    """``with det.pytorch.init(hparams=..., exp_conf=...) as context:`` (also
    usable as a plain call, seed 002). Creates the Core API context, the
    distributed setup and the seeds; yields a ``PyTorchTrialContext``."""
    kwargs = dict(locals())  # exactly the arguments above, passed on to _init
    return _InitHandle(lambda: _init(**kwargs))


def _searcher_length(length: Optional[int],
                     global_batch_size: Optional[int]) -> Optional[TrainUnit]:
    """The searcher's ``max_length`` (the trial's) in the unit the experiment
    config named (``DET_SEARCHER_UNIT``; batches when it named none)."""
    if length is None:
        return None
    unit = os.environ.get(envvars.SEARCHER_UNIT, "").strip().lower() or "batches"
    if unit == "records" and not global_batch_size:
        return None  # no global_batch_size hparam to convert it with: fit()'s stands
    try:
        return TrainUnit._from_searcher_unit(int(length), unit, global_batch_size)
    except ValueError:
        return None


def _check_unit(value: Any, name: str) -> None:
    if not isinstance(value, TrainUnit):
        raise TypeError(
            f"fit({name}=...) must be a det.pytorch.Batch or Epoch, got {value!r}"
        )


class Trainer:
    """Runs a ``PyTorchTrial``: ``Trainer(trial, context).fit(max_length=Epoch(1))``."""

    def __init__(self, trial: PyTorchTrial, context: PyTorchTrialContext) -> None:
        if isinstance(context, _InitHandle):
            context = context.__enter__()
        self._trial = trial
        self._context = context
        self._core = context._core
        self._info = getattr(self._core, "info", None) or resolve_info()
        self._local_training = self._info.trial is None or self._info.trial.local
        self.last_validation_metrics: Optional[dict[str, Any]] = None
        self.latest_checkpoint: Optional[str] = None

    def configure_profiler(self, sync_timings: bool = True, enabled: bool = False,
                           begin_on_batch: int = 0, end_after_batch: Optional[int] = None) -> None:
        logger.error("configure_profiler() is deprecated and does nothing; "
                     "use context.set_profiler() for torch profiler traces")

    def _searcher(self) -> tuple[Optional[str], bool]:
        """The searcher metric and its direction: the ``exp_conf`` given to
        init(), else what det-launch hands a trial or a ``--config`` run
        (DET_SEARCHER_METRIC, DET_SMALLER_IS_BETTER), as Determined's Trainer
        reads its experiment's config (checkpoint_policy="best" ranks by it)."""
        searcher = (self._context._exp_conf or {}).get("searcher") or {}
        metric = searcher.get("metric") or os.environ.get(envvars.SEARCHER_METRIC) or None
        if "smaller_is_better" in searcher:
            return metric, bool(searcher["smaller_is_better"])
        smaller = os.environ.get(envvars.SMALLER_IS_BETTER, "true").strip().lower()
        return metric, smaller not in ("0", "false", "no")  # as retention reads it

    def _resolve_checkpoint(self, latest: Optional[str]) -> Optional[str]:
        """FIX-10: a storage id, a checkpoint directory, or ``"latest"``."""
        if latest is None:
            return None
        if not isinstance(latest, (str, os.PathLike)):
            raise TypeError(f"fit(latest_checkpoint=...) must be a string, got {latest!r}")
        latest = os.fspath(latest)
        if latest == "latest":
            found = self._core.checkpoint.latest()
            if found is None:
                logger.info("latest_checkpoint='latest': no checkpoint yet, starting fresh")
            return found
        if os.path.isdir(latest):
            find_state_file(latest)  # not a checkpoint: say so before anything runs
            return latest
        try:
            # Checks that it is committed without downloading it (object storage).
            self._core.checkpoint.get_metadata(latest)
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(
                f"fit(latest_checkpoint={latest!r}): neither a checkpoint directory nor a "
                f"storage id in {self._core.checkpoint.storage_url} ({e}); pass a checkpoint "
                "directory, a storage id, or 'latest'"
            ) from None
        return latest

    def fit(
        self,
        checkpoint_period: Optional[TrainUnit] = None,
        validation_period: Optional[TrainUnit] = None,
        max_length: Optional[TrainUnit] = None,
        reporting_period: TrainUnit = Batch(100),  # noqa: B008 (immutable in practice)
        checkpoint_policy: Optional[str] = None,  # "best" (Determined's default) unless given
        latest_checkpoint: Optional[str] = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: Optional[bool] = None,
        async_checkpoints: bool = False,
    ) -> None:
        """Train until ``max_length``, validating, checkpointing and reporting at
        the given periods; returns early (after a checkpoint) on preemption or
        ``context.set_stop_requested(True)``. ``async_checkpoints``: training
        pauses only to copy the state to CPU memory; the save runs on a thread
        (one at a time), and fit() returns once the last one is committed.
        ``profiling_enabled``: system metrics (``core_context.profiler``, one sample
        a second) are on unless it is ``False``."""
        checkpoint_period = checkpoint_period or Batch(sys.maxsize)
        validation_period = validation_period or Batch(sys.maxsize)
        for value, name in ((checkpoint_period, "checkpoint_period"),
                            (validation_period, "validation_period"),
                            (reporting_period, "reporting_period")):
            _check_unit(value, name)
        policy_given = checkpoint_policy is not None
        checkpoint_policy = checkpoint_policy or "best"
        if checkpoint_policy not in _POLICIES:
            raise ValueError(
                f"fit(checkpoint_policy={checkpoint_policy!r}): use one of {list(_POLICIES)}"
            )
        metric, smaller_is_better = self._searcher()
        if self._local_training:
            if checkpoint_policy == "best" and metric is None:
                if policy_given:  # the default falls back quietly
                    logger.warning("checkpoint_policy='best' is not supported in local "
                                   "training mode. Falling back to 'all'.")
                checkpoint_policy = "all"
            if max_length is None:
                raise ValueError("max_length must be defined in local training mode.")
        else:
            if test_mode:
                raise ValueError("test_mode is only supported in local training mode.")
            # Seed 002: fit()'s max_length is "ignored by cluster training": the
            # searcher's (the experiment config's searcher.max_length) wins.
            searcher_length = _searcher_length(
                self._info.trial.max_length if self._info.trial else None,
                self._context._global_batch_size)
            if max_length is None:
                if searcher_length is None:
                    raise ValueError("`fit(max_length=X)` must be set to a Batch or Epoch")
                warnings.warn(f"fit() without max_length: using the searcher's max_length "
                              f"{searcher_length!r}; pass max_length explicitly", FutureWarning,
                              stacklevel=2)
                max_length = searcher_length
            elif searcher_length is not None and searcher_length != max_length:
                logger.warning("max_length=%s given to fit() is not used: under a searcher the "
                               "experiment config's searcher.max_length wins (%s)",
                               max_length, searcher_length)
                max_length = searcher_length
            if latest_checkpoint is None and self._info.latest_checkpoint:
                logger.warning(
                    "latest_checkpoint has not been configured. Pause/resume training will not "
                    "be able to continue from latest checkpoint. Did you mean to set "
                    "`fit(latest_checkpoint=info.latest_checkpoint)'?"
                )
        if not isinstance(max_length, (Batch, Epoch)) or not isinstance(max_length.value, int) \
                or isinstance(max_length.value, bool):
            raise TypeError(
                f"fit(max_length={max_length!r}): must be det.pytorch.Batch(n) or Epoch(n) "
                "with an integer n"
            )
        if test_mode:
            max_length = Batch(1)
        resolved = self._resolve_checkpoint(latest_checkpoint)
        available = self._info.latest_checkpoint
        if resolved is None and available and self._local_training and not test_mode:
            # The launcher or init() said a checkpoint is there; say that fit() does not use it.
            logger.warning("starting from batch 0, not from checkpoint %s (info."
                           "latest_checkpoint): fit() was given no latest_checkpoint; pass "
                           "fit(latest_checkpoint=info.latest_checkpoint) or 'latest' to "
                           "resume", available)
        dist = self._context.distributed
        if dist.size > 1:  # every rank restores what the chief resolved
            resolved = dist.broadcast(resolved)
        controller = self._trial.trial_controller_class(
            trial_inst=self._trial,
            context=self._context,
            checkpoint_period=checkpoint_period,
            validation_period=validation_period,
            reporting_period=reporting_period,
            smaller_is_better=smaller_is_better,
            steps_completed=self._context._steps_completed,
            latest_checkpoint=resolved,
            local_training=self._local_training,
            test_mode=test_mode,
            searcher_metric_name=metric,
            checkpoint_policy=checkpoint_policy,
            step_zero_validation=step_zero_validation,
            max_length=max_length,
            global_batch_size=self._context._global_batch_size,
            profiling_enabled=profiling_enabled is not False,
        )
        checkpointer = getattr(controller, "checkpointer", None) if async_checkpoints else None
        if checkpointer is not None:
            checkpointer.asynchronous = True
        try:
            if test_mode:  # its checkpoint must never become the real run's newest
                with self._core.checkpoint.outside_lineage():
                    controller.run()
            else:
                controller.run()
        except BaseException:
            if checkpointer is not None:
                checkpointer.finish(quiet=True)
            raise
        if checkpointer is not None:
            checkpointer.finish()  # the end of training (and a preemption) waits for the save
        self.last_validation_metrics = controller.last_validation_metrics
        self.latest_checkpoint = getattr(controller, "latest_storage_id", None) or resolved


# ``ctx.train(...)`` (seed 002) builds a Trainer; bound here, above the context.
seed002.bind(trainer_class=Trainer)
