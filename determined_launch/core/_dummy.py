"""``core._dummy_init``: a Core API context for unit tests and tools, with no
cluster detection and a throw-away run directory (Determined's test helpers
build their PyTorchTrial controllers on it). Also ``_DistributedBackend``,
Determined's reader of the ``USE_*`` launcher variables.
"""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
from typing import Any, Optional

from determined_launch import envvars
from determined_launch.cluster.info import ClusterInfo
from determined_launch.core._context import Context, _single_process
from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.preempt import PreemptContext, PreemptMode
from determined_launch.core.searcher import SearcherContext
from determined_launch.core.train import TrainContext

logger = logging.getLogger("determined_launch.core")


class DummyTrainContext(TrainContext):
    """``TrainContext`` plus the master-only calls, as harmless local stand-ins."""

    def __init__(self, dist: Collectives, run_dir: RunDir,
                 tensorboard_path: Optional[pathlib.Path] = None) -> None:
        super().__init__(dist, run_dir)
        self._trial_id: Optional[str] = None
        self._tensorboard_path = tensorboard_path or run_dir.path / "tensorboard"

    def get_tensorboard_path(self) -> pathlib.Path:
        return self._tensorboard_path

    def upload_tensorboard_files(self, *args: Any, **kwargs: Any) -> None:
        """Event files are already in place; nothing to upload."""

    def set_status(self, status: str) -> None:
        logger.info("status: %s", status)

    def report_early_exit(self, reason: Any) -> None:
        logger.info("early exit: %s", reason)

    def get_experiment_best_validation(self) -> Optional[float]:
        """No master, no experiment-wide best: ``None`` ("no previous best")."""
        return None

    def _get_last_validation(self) -> Optional[int]:
        return None


def _dummy_init(
    *,
    distributed: Optional[Collectives] = None,
    checkpoint_storage: Optional[str] = None,
    tensorboard_path: Optional[os.PathLike[str] | str] = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
) -> Context:
    """A ``Context`` for tests: one node, no trial, metrics in a temporary run
    directory, checkpoints in ``checkpoint_storage`` (default: inside it)."""
    dist = distributed if distributed is not None else _single_process()
    run_path = pathlib.Path(tempfile.mkdtemp(prefix="det-dummy-run-"))
    rundir = RunDir(run_path, trial_id=None)
    storage = pathlib.Path(checkpoint_storage) if checkpoint_storage else run_path / "checkpoints"
    info = ClusterInfo(container_addrs=("127.0.0.1",), container_rank=0,
                       container_slot_counts=(dist.size,), slot_ids=(), source="dummy")
    train = DummyTrainContext(
        dist, rundir, pathlib.Path(tensorboard_path) if tensorboard_path else None
    )
    context = Context(
        distributed=dist,
        preempt=PreemptContext(dist, preempt_mode),
        train=train,
        checkpoint=CheckpointContext(dist, storage, rundir),
        searcher=SearcherContext(dist, rundir, train, None),
        info=info,
        run_dir=run_path,
    )
    context._tensorboard_manager = None  # type: ignore[attr-defined]
    return context


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


class _DistributedBackend:
    """Which distributed backend the launcher asked for (``USE_*`` variables)."""

    TORCH = "USE_TORCH_DISTRIBUTED"
    HOROVOD = "USE_HOROVOD"
    DEEPSPEED = "USE_DEEPSPEED"

    def use_torch(self) -> bool:
        return _env_flag(envvars.USE_TORCH_DISTRIBUTED)

    def use_horovod(self) -> bool:
        return _env_flag(self.HOROVOD)

    def use_deepspeed(self) -> bool:
        return _env_flag(self.DEEPSPEED)
