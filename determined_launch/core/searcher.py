"""``core_context.searcher``: the "single" searcher, run locally.

There is no master choosing lengths here, so ``operations()`` yields one
operation whose ``length`` is the configured maximum: ``init(max_length=...)``,
else ``trial.max_length`` of the cluster info (the place of the experiment
config's ``searcher.max_length``). Lengths are absolute, as in Determined:
a resumed run trains from where it stopped up to ``op.length``.

This is also what Determined 0.38 does on a cluster: ``operations()`` no
longer asks the master; adaptive searchers stop a trial by preempting it.
``det-launch experiment`` does the same (docs/search.md).
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Iterator
from typing import Any, Optional

from determined_launch import envvars
from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir, require_chief
from determined_launch.core.train import TrainContext

logger = logging.getLogger("determined_launch.core")


class Unit(enum.Enum):
    """The unit of ``searcher.max_length`` in the experiment config."""

    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class SearcherMode(enum.Enum):
    """Who calls ``operations()``: every rank in step (``WorkersAskChief``),
    or the chief alone (``ChiefOnly``; other ranks get ``RuntimeError``)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHEIF_ONLY"  # sic: Determined 0.38.1's value, kept for code comparing values


def configured_unit(env: Optional[Any] = None) -> Optional[Unit]:
    """``DET_SEARCHER_UNIT`` (set by ``det-launch experiment`` from
    ``max_length: {batches: N}``), else no unit (``max_length: N``)."""
    raw = (os.environ if env is None else env).get(envvars.SEARCHER_UNIT, "").strip().upper()
    try:
        return Unit(raw) if raw else None
    except ValueError:
        return None


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

    def operations(
        self,
        searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
        auto_ack: bool = True,
    ) -> Iterator[SearcherOperation]:
        """Every rank iterates the same operations, with no communication
        (all ranks read the same length from the cluster info).

        ``searcher_mode=SearcherMode.ChiefOnly``: only the chief may iterate;
        on any other rank it raises ``RuntimeError``, as in Determined.
        ``auto_ack`` is accepted for Determined's signature; there is no
        master to acknowledge the end of the operations to.

        On the chief, asking for the next operation before calling
        ``report_completed()`` on the current one raises ``RuntimeError``
        (leaving the loop early, for preemption, is fine).
        """
        mode = SearcherMode(searcher_mode)
        if mode == SearcherMode.ChiefOnly and self._dist.rank != 0:
            raise RuntimeError(
                "searcher.operations(searcher_mode=ChiefOnly) was called on a non-chief worker "
                f"(rank={self._dist.rank}); only the chief may iterate in ChiefOnly mode"
            )
        del auto_ack
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

    def acknowledge_out_of_ops(self) -> None:
        """Accepted and ignored, as in Determined 0.38.1 (nothing to acknowledge)."""

    def get_configured_units(self) -> Optional[Unit]:
        """The unit of the config's ``searcher.max_length`` (``{batches: 64}``
        gives ``Unit.BATCHES``), or ``None`` for a plain number or no config."""
        return configured_unit()
