"""``core_context.searcher``: the "single" searcher, run locally.

There is no master choosing lengths here, so ``operations()`` yields one
operation whose ``length`` is the configured maximum: ``init(max_length=...)``,
else ``trial.max_length`` of the cluster info (the place of the experiment
config's ``searcher.max_length``). Lengths are absolute, as in Determined:
a resumed run trains from where it stopped up to ``op.length``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Optional

from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir, require_chief
from determined_launch.core.train import TrainContext

logger = logging.getLogger("determined_launch.core")


class SearcherOperation:
    """Train until ``length`` (absolute), validate, then ``report_completed``."""

    def __init__(self, searcher: SearcherContext, length: int) -> None:
        self._searcher = searcher
        self._length = length
        self._completed = False

    @property
    def length(self) -> int:
        return self._length

    def report_progress(self, length: float) -> None:
        """Chief only: how far along ``length`` training has got."""
        require_chief(self._searcher._dist, "op.report_progress()")
        if self._completed:
            raise RuntimeError("op.report_progress() called after op.report_completed()")
        self._searcher._train.report_progress(min(1.0, max(0.0, length / self._length)))

    def report_completed(self, searcher_metric: Any) -> None:
        """Chief only: the validation metric reached at ``length``."""
        require_chief(self._searcher._dist, "op.report_completed()")
        if self._completed:
            raise RuntimeError("op.report_completed() may only be called once per operation")
        self._completed = True
        logger.info("op.report_completed(length=%d, metric=%s)", self._length, searcher_metric)
        self._searcher._run_dir.append(
            "searcher", {"length": self._length, "searcher_metric": searcher_metric}
        )


class SearcherContext:
    """Yields the training lengths to complete, as Determined's searcher does."""

    def __init__(
        self, dist: Collectives, run_dir: RunDir, train: TrainContext, max_length: Optional[int]
    ) -> None:
        self._dist = dist
        self._run_dir = run_dir
        self._train = train
        self._max_length = max_length

    @property
    def max_length(self) -> Optional[int]:
        return self._max_length

    def operations(self) -> Iterator[SearcherOperation]:
        """Every rank iterates the same operations, with no communication.

        On the chief, asking for the next operation before calling
        ``report_completed()`` on the current one raises ``RuntimeError``
        (leaving the loop early, for preemption, is fine).
        """
        if self._max_length is None:
            raise RuntimeError(
                "the searcher has no length: set trial.max_length in the cluster info file "
                "or pass core.init(max_length=N)"
            )
        op = SearcherOperation(self, self._max_length)
        yield op
        if self._dist.rank == 0 and not op._completed:
            raise RuntimeError(
                "op.report_completed() must be called on the chief before the next operation"
            )
