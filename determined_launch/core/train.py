"""``core_context.train``: metrics reporting into the run directory."""

from __future__ import annotations

import logging
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any, Optional

from determined_launch.core import _progress
from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir, require_chief
from determined_launch.core._train_local import LocalTrainCalls
from determined_launch.core.tensorboard import TensorboardManager, TensorboardMode
from determined_launch.core.trackers import Trackers
from determined_launch.values import plain_metrics

logger = logging.getLogger("determined_launch.core")

_GROUP_RE = re.compile(r"[A-Za-z0-9_-]+")
#: Streams of the run directory that are not metric groups.
_RESERVED_GROUPS = frozenset({"progress", "searcher", "profiler", "task_sources", "checkpoints",
                              "stragglers"})


class TrainContext(LocalTrainCalls):
    """Local stand-in for Determined's ``TrainContext``.

    Each report is one JSON line in ``<run_dir>/<group>.jsonl`` with the
    fields ``time``, ``trial_id``, ``steps_completed`` and ``metrics``
    (plus ``batch_metrics`` when given). Only the chief may report. Each
    report logs one line unless ``log_reports`` is off (the PyTorch Trainer
    logs its own line instead).
    """

    log_reports = True

    def __init__(self, dist: Collectives, run_dir: RunDir,
                 tensorboard: Optional[TensorboardManager] = None,
                 trackers: Optional[Trackers] = None) -> None:
        self._dist = dist
        self._run_dir = run_dir
        self._tensorboard = tensorboard
        #: the chief's MLflow / W&B sinks (``--report-to``; core/trackers/)
        self._trackers = trackers

    def _sync_tensorboard(self, *, force: bool = False) -> None:
        """For the PyTorch Trainer, which writes its own event files in MANUAL
        mode: sync them as AUTO mode would (object storage only, rate-limited)."""
        if self._tensorboard is not None:
            self._tensorboard.sync_as_auto(force=force)

    def get_tensorboard_path(self) -> pathlib.Path:
        """This rank's TensorBoard directory (synced to checkpoint storage)."""
        if self._tensorboard is None:
            raise ValueError("no TensorBoard directory: this context was built without one")
        return self._tensorboard.base_path

    def upload_tensorboard_files(
        self,
        selector: Callable[[pathlib.Path], bool] = lambda _: True,
        mangler: Callable[[pathlib.Path, int], pathlib.Path] = lambda p, __: p,
    ) -> None:
        """MANUAL mode: upload new or changed files of ``get_tensorboard_path()``
        (those ``selector`` accepts, named by ``mangler(relative path, rank)``)."""
        if self._tensorboard is None:
            raise ValueError("no TensorBoard directory: this context was built without one")
        if self._tensorboard.mode is TensorboardMode.AUTO:
            raise RuntimeError("upload_tensorboard_files can only be used in MANUAL mode "
                               "(core.init(tensorboard_mode=TensorboardMode.MANUAL))")
        self._tensorboard.sync(selector, mangler, force=True)

    def report_training_metrics(
        self,
        steps_completed: Optional[int] = None,
        metrics: Optional[Mapping[str, Any]] = None,
        batch_metrics: Optional[list[Mapping[str, Any]]] = None,
        *,
        latest_batch: Optional[int] = None,
    ) -> None:
        """Append to ``training.jsonl``. ``latest_batch``: the Core API's first
        name for ``steps_completed`` (accepted with one deprecation line)."""
        method = "report_training_metrics()"
        steps = _steps(method, steps_completed, latest_batch)
        self._report(method, "training", steps, _required(method, metrics), batch_metrics)

    def report_validation_metrics(
        self,
        steps_completed: Optional[int] = None,
        metrics: Optional[Mapping[str, Any]] = None,
        *,
        latest_batch: Optional[int] = None,
    ) -> None:
        """Append to ``validation.jsonl``. Independent of the searcher metric,
        which ``op.report_completed()`` reports. ``latest_batch``: as above."""
        method = "report_validation_metrics()"
        steps = _steps(method, steps_completed, latest_batch)
        self._report(method, "validation", steps, _required(method, metrics))

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Append to ``<group>.jsonl``; ``group`` is letters, digits, ``_`` and ``-``."""
        if not _GROUP_RE.fullmatch(group) or group in _RESERVED_GROUPS:
            raise ValueError(
                f"metrics group {group!r} is not allowed: use letters, digits, '_' and '-', "
                f"and not {sorted(_RESERVED_GROUPS)}"
            )
        self._report("report_metrics()", group, steps_completed, metrics)

    def report_progress(self, progress: float) -> None:
        """Fraction of the searcher's length completed, in [0, 1]."""
        require_chief(self._dist, "report_progress()")
        if not 0 <= progress <= 1:
            raise ValueError(f"progress must be between 0 and 1, got {progress}")
        self._run_dir.append("progress", {"progress": float(progress)})

    def _report(
        self,
        method: str,
        group: str,
        steps_completed: int,
        metrics: Mapping[str, Any],
        batch_metrics: Optional[list[Mapping[str, Any]]] = None,
    ) -> None:
        require_chief(self._dist, method)
        _progress.beat()
        if not isinstance(metrics, Mapping):
            raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
        if self.log_reports:
            logger.info("%s: steps_completed=%s, %s", method, steps_completed,
                        plain_metrics(metrics))
        record: dict[str, Any] = {"steps_completed": steps_completed, "metrics": dict(metrics)}
        if batch_metrics is not None:
            record["batch_metrics"] = [dict(m) for m in batch_metrics]
        self._run_dir.append(group, record)
        if self._tensorboard is not None:
            self._tensorboard.on_report(group, steps_completed, metrics)
        if self._trackers is not None:
            self._trackers.report(group, steps_completed, metrics)


_warned_latest_batch: set[str] = set()


def _steps(method: str, steps_completed: Optional[int], latest_batch: Optional[int]) -> int:
    """``steps_completed``, or ``latest_batch`` (the Core API's first name for
    it, as Determined's 0.17 blog post calls it) with one deprecation line."""
    if latest_batch is None:
        if steps_completed is None:
            raise TypeError(f"{method} missing required argument: 'steps_completed'")
        return steps_completed
    if steps_completed is not None:
        raise TypeError(f"{method}: give steps_completed or latest_batch (its old name), "
                        "not both")
    if method not in _warned_latest_batch:
        _warned_latest_batch.add(method)
        logger.warning("%s: latest_batch= is deprecated; use steps_completed=", method)
    return latest_batch


def _required(method: str, metrics: Optional[Mapping[str, Any]]) -> Mapping[str, Any]:
    if metrics is None:
        raise TypeError(f"{method} missing required argument: 'metrics'")
    return metrics
