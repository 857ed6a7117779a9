"""Seed 000's Generic API (the Core API's first form): ``det.generic.init()``.

A thin layer over the Core API, in the seed's spelling::

    context = det.generic.init()
    hparams = context.training.hparams           # info.trial.hparams
    seed = context.training.trial_seed           # info.trial.trial_seed
    if context.latest_checkpoint is not None:    # None, or a context manager
        with context.latest_checkpoint as path:  # checkpoint.restore_path()
            ...
    searcher_op = context.training.basic_search()   # searcher.operations()
    for epoch in range(last_epoch + 1, searcher_op.epochs):  # the config's max_length
        if context.should_preempt():             # preempt.should_preempt()
            break
        context.training.report_training_metrics(batches_trained=n, metrics={...})
        context.training.report_validation_metrics(batches_trained=n, metrics={...})
        searcher_op.report_progress(epoch)       # or, on the last epoch:
        searcher_op.complete(metric)             # op.report_completed()
        with context.checkpoint.save_path() as path:  # checkpoint.store_path()
            ...

``batches_trained`` is the Core API's ``steps_completed``, and the newest one
reported is the ``steps_completed`` of the checkpoints saved after it.
Reports and checkpoints are the chief's: on other ranks they do nothing (the
seed's script has no rank checks), and ``save_path()`` gives them a scratch
directory that is thrown away. Importing this module never imports torch.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pathlib
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from determined_launch import core
from determined_launch.core._dist import Collectives

logger = logging.getLogger("determined_launch.generic")


def _number(value: Any) -> Any:
    """A torch or numpy scalar as a plain number (the seed's metrics are tensors)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


class SearchOperation:
    """``basic_search()``'s answer: how long to train, and the result."""

    def __init__(self, op: core.SearcherOperation, chief: bool) -> None:
        self._op = op
        self._chief = chief

    @property
    def epochs(self) -> int:
        """The config's ``searcher.max_length`` (the seed trains that many epochs)."""
        return self._op.length

    @property
    def length(self) -> int:
        return self._op.length

    def report_progress(self, progress: float) -> None:
        """How far along ``epochs`` training has got (optional)."""
        if self._chief:
            self._op.report_progress(float(_number(progress)))

    def complete(self, metric: Any) -> None:
        """The searcher metric reached at the end of training; once."""
        if self._chief:
            self._op.report_completed(_number(metric))


class Training:
    """``context.training``: hyperparameters, seed, metrics and the searcher."""

    def __init__(self, context: Context) -> None:
        self._context = context
        trial = context.core.info.trial
        self.hparams: Mapping[str, Any] = trial.hparams if trial is not None else {}
        self.trial_seed: int = trial.trial_seed if trial is not None else 0

    def report_training_metrics(self, batches_trained: int, metrics: Mapping[str, Any]) -> None:
        self._context._report("training", batches_trained, metrics)

    def report_validation_metrics(self, batches_trained: int, metrics: Mapping[str, Any]) -> None:
        self._context._report("validation", batches_trained, metrics)

    def basic_search(self) -> SearchOperation:
        """The one operation of the searcher: train ``.epochs``, then ``.complete()``."""
        searcher = self._context.core.searcher
        if searcher.max_length is None:
            raise RuntimeError(
                "basic_search(): the searcher has no length: run under det-launch with "
                "--config CONFIG.yaml (its searcher.max_length), or det-launch experiment "
                "CONFIG.yaml, or pass det.generic.init(max_length=N)")
        op = next(iter(searcher.operations()))
        return SearchOperation(op, self._context.is_chief)


class Checkpoints:
    """``context.checkpoint``: ``with context.checkpoint.save_path() as path:``."""

    def __init__(self, context: Context) -> None:
        self._context = context

    @contextlib.contextmanager
    def save_path(self, metadata: Optional[Mapping[str, Any]] = None) -> Iterator[pathlib.Path]:
        """A directory to save into; committed when the block ends without an error."""
        context = self._context
        if not context.is_chief:
            with tempfile.TemporaryDirectory(prefix="det-generic-") as scratch:
                yield pathlib.Path(scratch)
            return
        meta = {"steps_completed": context.batches_trained, **(metadata or {})}
        with context.core.checkpoint.store_path(meta) as (path, _storage_id):
            yield path


class LatestCheckpoint:
    """The checkpoint to resume from: ``with context.latest_checkpoint as path:``."""

    def __init__(self, context: core.Context, storage_id: str) -> None:
        self._core = context
        self.storage_id = storage_id
        self._open: list[contextlib.AbstractContextManager[pathlib.Path]] = []

    def __enter__(self) -> pathlib.Path:
        restore = self._core.checkpoint.restore_path(self.storage_id)
        path = restore.__enter__()
        self._open.append(restore)
        return path

    def __exit__(self, *exc: Any) -> None:
        self._open.pop().__exit__(*exc)

    def __repr__(self) -> str:
        return f"LatestCheckpoint({self.storage_id!r})"


class Context:
    """What ``det.generic.init()`` returns; ``.core`` is the Core API context."""

    def __init__(self, core_context: core.Context) -> None:
        self.core = core_context
        self.distributed: Collectives = core_context.distributed
        self.is_chief = core_context.distributed.rank == 0
        latest = core_context.info.latest_checkpoint
        self.latest_checkpoint = (LatestCheckpoint(core_context, latest)
                                  if latest is not None else None)
        # Checkpoints saved before the first report of a resumed run keep its step.
        self.batches_trained = 0
        if latest is not None and self.is_chief:
            steps = core_context.checkpoint.get_metadata(latest).get("steps_completed")
            self.batches_trained = steps if isinstance(steps, int) else 0
        self.training = Training(self)
        self.checkpoint = Checkpoints(self)
        self._closed = False

    def should_preempt(self, block: bool = True) -> bool:
        """True when the job should checkpoint and exit (to be resumed)."""
        return self.core.preempt.should_preempt(block=block)

    def _report(self, group: str, batches_trained: int, metrics: Mapping[str, Any]) -> None:
        self.batches_trained = batches_trained
        if not self.is_chief:
            return
        if group == "training":
            self.core.train.report_training_metrics(batches_trained, metrics)
        else:
            self.core.train.report_validation_metrics(batches_trained, metrics)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.core.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


def _distributed() -> Optional[Collectives]:
    """Several ranks started by a launcher (``WORLD_SIZE``): their context from
    the launcher's variables; one process otherwise."""
    world = os.environ.get("WORLD_SIZE", "1")
    if world.isdigit() and int(world) > 1:
        return core.DistributedContext.from_env()
    return None


def init(
    *,
    distributed: Optional[Collectives] = None,
    checkpoint_storage: Any = None,
    run_dir: Optional[str] = None,
    max_length: Optional[int] = None,
) -> Context:
    """``det.generic.init()``: the Core API context (``core.init()``, same
    arguments), in the seed's spelling. Closed at exit, or by ``with``."""
    core_context = core.init(
        distributed=distributed if distributed is not None else _distributed(),
        checkpoint_storage=checkpoint_storage,
        run_dir=run_dir,
        max_length=max_length,
    )
    core_context.start()
    context = Context(core_context)
    atexit.register(context.close)
    return context


__all__ = ["Checkpoints", "Context", "LatestCheckpoint", "SearchOperation", "Training", "init"]
