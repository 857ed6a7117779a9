"""``core.init()``: the seed's Core API, running without a Determined master."""

from __future__ import annotations

import logging
import os
import pathlib
import sys
from typing import Any, Literal, Optional

from determined_launch import envvars
from determined_launch import rundir as run_dirs
from determined_launch._user import InvalidHP
from determined_launch.cluster import ClusterInfo, resolve_cluster_info
from determined_launch.cluster.local_trial import RUNS_ROOT, default_run_dir
from determined_launch.core import _progress
from determined_launch.core._alerts import send_alert
from determined_launch.core._dist import Collectives, note_finished
from determined_launch.core._experimental import (
    DummyExperimentalCoreContext,
    ExperimentalCoreContext,
)
from determined_launch.core._profiler import DummyProfilerContext, ProfilerContext
from determined_launch.core._rundir import STOP_REASON, RunDir
from determined_launch.core._storage_setup import build_storage
from determined_launch.core._train_local import EarlyExitReason
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.preempt import DEFAULT_SYNC_PERIOD, PreemptContext, PreemptMode
from determined_launch.core.searcher import SearcherContext
from determined_launch.core.storage import (
    StorageSpec,
    commit_check,
    configured_storage,
    parse_storage,
)
from determined_launch.core.tensorboard import TensorboardManager, TensorboardMode
from determined_launch.core.trackers import Trackers, final_state, identity
from determined_launch.core.trackers import from_env as trackers_from_env
from determined_launch.core.train import TrainContext
from determined_launch.errors import LaunchError

logger = logging.getLogger("determined_launch.core")

#: Directory for this run's metrics and latest-checkpoint pointer.
RUN_DIR_ENV = envvars.RUN_DIR
#: Directory holding checkpoints (shared by all nodes that write or restore).
CHECKPOINT_STORAGE_ENV = envvars.CHECKPOINT_STORAGE
#: Parent of the default run directories, relative to the working directory.
DEFAULT_RUNS_ROOT = RUNS_ROOT


class Context:
    """What ``core.init()`` returns: ``.distributed``, ``.preempt``, ``.train``,
    ``.checkpoint``, ``.searcher``, ``.profiler``, ``.experimental``, and
    ``.info`` (this node's ``ClusterInfo``).

    Use it as a context manager (or call ``start()`` and ``close()``); leaving
    it closes the ``DistributedContext`` (including one you passed in), as
    Determined's does. ``det.InvalidHP`` leaving the block is reported as an
    early exit and ends the process with status 0, as in Determined.
    """

    def __init__(
        self,
        *,
        distributed: Collectives,
        preempt: PreemptContext,
        train: TrainContext,
        checkpoint: CheckpointContext,
        searcher: SearcherContext,
        info: ClusterInfo,
        run_dir: pathlib.Path,
        profiler: Optional[ProfilerContext] = None,
        experimental: Optional[ExperimentalCoreContext] = None,
        tensorboard: Optional[TensorboardManager] = None,
        trackers: Optional[Trackers] = None,
    ) -> None:
        self.distributed = distributed
        self.preempt = preempt
        self.train = train
        self.checkpoint = checkpoint
        self.searcher = searcher
        self.info = info
        self.run_dir = run_dir
        self.profiler = profiler or DummyProfilerContext()
        self.experimental = experimental or DummyExperimentalCoreContext()
        self._tensorboard = tensorboard
        self._trackers = trackers
        self._final_state = "completed"

    def start(self) -> None:
        self.preempt.start()
        _progress.start(self.distributed.rank)  # the launcher's hang watchdog (no-op outside)

    def __enter__(self) -> Context:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, _tb: Any) -> None:
        preempted = bool(getattr(self.preempt, "_decided", False))
        reason = self._stop_reason() if preempted and self._trackers is not None else None
        self._final_state = final_state(exc, preempted, reason)
        self.close(exc_type, exc, _tb)
        if exc_type is None:
            note_finished(self.distributed.rank)
        if isinstance(exc, InvalidHP):
            self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            logger.info("InvalidHP raised: reported as an early exit; exiting with status 0")
            raise SystemExit(0)

    def _stop_reason(self) -> Optional[str]:
        """Why the experiment's driver stopped this trial, if it did."""
        try:
            pointer = self.train._run_dir.read_pointer(STOP_REASON)
        except RuntimeError:
            return None  # unreadable: a plain preemption
        return str(pointer.get("reason")) if pointer else None

    def close(self, *_exc_info: Any) -> None:
        # A background checkpoint save finishes first (preemption and the end
        # of training wait for it); its failure is one line, raised unless
        # another error is already on its way out.
        save_failed = self.checkpoint._drain()
        self.profiler._close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._trackers is not None:
            self._trackers.close(self._final_state)
        _progress.stop()
        self.preempt.close()
        self.distributed.close()
        self.train._run_dir.close()
        if save_failed is not None and not (_exc_info and _exc_info[0] is not None):
            raise save_failed

    def alert(
        self,
        title: Optional[str] = None,
        description: Optional[str] = None,
        level: Optional[Literal["warn", "info", "debug", "error"]] = "info",
    ) -> None:
        """A log line at ``level``; also a webhook POST when ``DET_ALERT_WEBHOOK`` is set."""
        send_alert(self.info, title, description, level)


def _single_process() -> Collectives:
    from determined_launch.core.distributed import DistributedContext

    return DistributedContext(
        rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1
    )


def _directory(value: str, what: str) -> pathlib.Path:
    if "://" in value:
        raise LaunchError(f"{what}: {value!r}: only directories are supported, not URLs")
    return pathlib.Path(value).expanduser().absolute()


def resolve_run_dir(run_dir: Optional[str], info: ClusterInfo) -> pathlib.Path:
    """``run_dir`` argument, else ``DET_RUN_DIR``, else
    ``./det_runs/trial-<trial_id>`` (``./det_runs/local`` for the local trial,
    or without a trial; the launcher finds checkpoints to resume by the same
    rule, ``cluster/local_trial.py``)."""
    if run_dir:
        return _directory(str(run_dir), "core.init(run_dir=...)")
    if os.environ.get(RUN_DIR_ENV):
        return _directory(os.environ[RUN_DIR_ENV], f"environment variable {RUN_DIR_ENV}")
    return default_run_dir(info.trial)


def resolve_checkpoint_storage(
    storage: Any, run_dir: pathlib.Path, info: Optional[ClusterInfo] = None
) -> StorageSpec:
    """``checkpoint_storage`` argument, else ``DET_CHECKPOINT_STORAGE``, else
    the cluster info's ``checkpoint_storage``, else ``checkpoints/`` beside
    the run directory, so that the trials of one experiment share storage
    and one trial's storage id restores in another. Any form
    ``storage.parse_storage`` accepts: a directory, a URL, a storage block."""
    if storage:
        return parse_storage(storage, where="core.init(checkpoint_storage=...)")
    configured = configured_storage(os.environ, getattr(info, "checkpoint_storage", None))
    if configured is not None:
        return configured
    return parse_storage(str(run_dir.parent / "checkpoints"), where="default checkpoint storage")


def resolve_info() -> ClusterInfo:
    """This process's cluster info, in local mode too, with a resume point that
    is a *committed* checkpoint also on object storage (the commit-marker check
    that only this layer can open)."""
    return resolve_cluster_info(commit_check=commit_check)


def init(
    *,
    distributed: Optional[Collectives] = None,
    checkpoint_storage: Any = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    run_dir: Optional[str] = None,
    max_length: Optional[int] = None,
    info: Optional[ClusterInfo] = None,
    preempt_sync_period: float = DEFAULT_SYNC_PERIOD,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
) -> Context:
    """Build the Core API context. Use as ``with core.init() as core_context:``.

    ``distributed``: required when more than one worker runs (for example
    ``DistributedContext.from_torch_distributed()``); ``None`` means a single
    process. ``checkpoint_storage``: a directory, a URL (``s3://``, ``gs://``,
    ``az://``) or a Determined storage block, see ``resolve_checkpoint_storage``.
    ``run_dir``: a directory, see ``resolve_run_dir``. ``tensorboard_mode``:
    see ``TensorboardMode``. ``max_length``:
    the searcher's length, overriding ``info.trial.max_length``. ``info``:
    defaults to ``det.get_cluster_info()``, or in local mode (where that is
    ``None``) the local machine and its local trial. ``preempt_sync_period``: see
    ``PreemptContext``.
    """
    info = info if info is not None else resolve_info()
    if distributed is None:
        world = os.environ.get("WORLD_SIZE", "1")
        if world.isdigit() and int(world) > 1:
            raise LaunchError(
                f"core.init(): WORLD_SIZE={world} workers are running but no DistributedContext "
                "was passed; use core.init(distributed=DistributedContext.from_torch_distributed())"
            )
        distributed = _single_process()

    rundir_path = resolve_run_dir(run_dir, info)
    # The local trial's records carry its id, 0 (earlier versions wrote null).
    trial_id = info.trial.trial_id if info.trial is not None else None
    # The run's owner: recorded by the launcher (or a rerun); else this process,
    # recorded by its first write (a bare process never creates a directory for nothing).
    owner = run_dirs.read_command(rundir_path)
    mine = run_dirs.command_of(sys.argv) if owner is None and distributed.rank == 0 else None
    rundir = RunDir(rundir_path, trial_id=trial_id,
                    hparams=info.trial.hparams if info.trial is not None else None,
                    command=run_dirs.command_key(owner or mine or ()) if owner or mine else None,
                    owner=mine)
    spec = resolve_checkpoint_storage(checkpoint_storage, rundir_path, info)
    storage = build_storage(spec, distributed, rundir, tensorboard_mode)
    if max_length is None and info.trial is not None:
        max_length = info.trial.max_length

    trackers = None if distributed.rank != 0 else trackers_from_env(
        os.environ, identity(rundir_path, trial_id, rundir.hparams),
        resuming=info.latest_checkpoint is not None, tensorboard_dir=storage.tensorboard.base_path)
    train = TrainContext(distributed, rundir, storage.tensorboard, trackers)
    after_commit = storage.after_commit
    if trackers is not None:
        after_commit = trackers.after_commit(after_commit, spec.url)
    context = Context(
        distributed=distributed,
        preempt=PreemptContext.from_env(distributed, preempt_mode, sync_period=preempt_sync_period),
        train=train,
        checkpoint=CheckpointContext(distributed, storage.backend, rundir,
                                     after_commit=after_commit,
                                     resolved_latest=(info.latest_checkpoint,)
                                     if info.resolved and not run_dir else None),
        searcher=SearcherContext(distributed, rundir, train, max_length),
        info=info,
        run_dir=rundir_path,
        profiler=ProfilerContext(distributed, rundir,
                                 on_report=trackers.system if trackers is not None else None),
        experimental=ExperimentalCoreContext(rundir),
        tensorboard=storage.tensorboard,
        trackers=trackers,
    )
    if distributed.rank == 0:
        logger.info("core.init: run directory %s, checkpoint storage %s", rundir_path, spec.url)
    return context
