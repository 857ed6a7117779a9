"""``core._dummy_init``: a Core API context for unit tests and tools, with no
cluster detection and a throw-away run directory (Determined's test helpers
build their PyTorchTrial controllers on it); the ``Dummy*`` contexts it is
made of, with Determined's constructors. Also ``_DistributedBackend``,
Determined's reader of the ``USE_*`` launcher variables.
"""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from determined_launch import envvars
from determined_launch.cluster.info import ClusterInfo
from determined_launch.core._context import Context, _single_process
from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.distributed import DistributedContext
from determined_launch.core.preempt import PreemptContext, PreemptMode
from determined_launch.core.searcher import SearcherContext, SearcherOperation
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


class DummyDistributedContext(DistributedContext):
    """One process: rank 0 of 1; collectives return at once."""

    def __init__(self) -> None:
        super().__init__(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)


class DummyPreemptContext(PreemptContext):
    """Never preempts (unless ``request_preemption()`` on the chief), with
    Determined's synchronization: in ``WorkersAskChief`` mode the chief
    broadcasts its answer and the workers receive it, so code tested with it
    makes the same collectives as on a cluster; ``ChiefOnly`` refuses workers;
    ``should_preempt()`` before ``start()`` is an error."""

    def __init__(self, dist: Collectives,
                 preempt_mode: PreemptMode = PreemptMode.WorkersAskChief) -> None:
        super().__init__(dist, preempt_mode)
        self._started = False

    def start(self) -> PreemptContext:
        self._started = True
        return self

    def should_preempt(self, auto_ack: bool = True, block: bool = True) -> bool:
        if not self._started:
            raise RuntimeError("you cannot call should_preempt() before start() "
                               "(or entering the context)")
        answer = self._requested is not None
        if self._dist.rank == 0:
            if self.mode == PreemptMode.WorkersAskChief:
                self._dist.broadcast(answer)
            return answer
        if self.mode == PreemptMode.ChiefOnly:
            raise RuntimeError(f"should_preempt() called from non-chief rank {self._dist.rank}, "
                               "but preempt_mode is ChiefOnly")
        if self.mode == PreemptMode.WorkersAskChief:
            return bool(self._dist.broadcast(None))
        return answer


class _NullRunDir(RunDir):
    """A run directory that keeps nothing (the dummy searcher's)."""

    def __init__(self) -> None:
        super().__init__(pathlib.Path(os.devnull), trial_id=None)

    def append(self, stream: str, record: Mapping[str, Any]) -> None:
        logger.debug("%s: %s", stream, dict(record))

    def write_pointer(self, name: str, value: Mapping[str, Any]) -> None:
        logger.debug("%s: %s", name, dict(value))

    def read_pointer(self, name: str) -> Optional[dict[str, Any]]:
        return None


class DummyCheckpointContext(CheckpointContext):
    """Checkpoints in ``storage_manager``: a directory, or an object with a
    ``base_path`` (Determined passes a shared-file-system storage manager)."""

    def __init__(self, dist: Collectives, storage_manager: Any) -> None:
        base = getattr(storage_manager, "_base_path", None) or getattr(
            storage_manager, "base_path", storage_manager)
        super().__init__(dist, pathlib.Path(os.fspath(base)), _NullRunDir())


class DummySearcherContext(SearcherContext):
    """One operation of ``length`` (default 1); nothing is recorded."""

    def __init__(self, dist: Collectives, length: int = 1) -> None:
        nothing = _NullRunDir()
        super().__init__(dist, nothing, DummyTrainContext(dist, nothing), length)


class DummySearcherOperation(SearcherOperation):
    """A stand-alone operation of ``length``; completing it only logs."""

    def __init__(self, length: int, is_chief: bool) -> None:
        self._length = length
        self._is_chief = is_chief
        self._completed = False

    def report_progress(self, length: float) -> None:
        if not self._is_chief:
            raise RuntimeError("op.report_progress() may only be called on the chief")
        logger.info("progress: %s/%s", length, self._length)

    def report_completed(self, searcher_metric: Any) -> None:
        if not self._is_chief:
            raise RuntimeError("op.report_completed() may only be called on the chief")
        if self._completed:
            raise RuntimeError("op.report_completed() may only be called once per operation")
        self._completed = True
        logger.info("op.report_completed(length=%d, metric=%s)", self._length, searcher_metric)


class SearcherContextMissing(SearcherContext):
    """No searcher length was configured: ``operations()`` says how to set one."""

    def __init__(self) -> None:
        pass

    def operations(self, *_args: Any, **_kwargs: Any) -> Iterator[SearcherOperation]:
        raise ValueError(
            "no searcher length is configured: set trial.max_length in the cluster info, pass "
            "core.init(max_length=N), or (as Determined 0.38 recommends) set the training "
            "length in your code and do not use core_context.searcher"
        )


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
