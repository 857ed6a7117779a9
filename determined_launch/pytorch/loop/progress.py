"""Human-facing progress: one INFO line per report, and an optional tqdm bar.

The bar is shown on the chief only, when stderr is a terminal and ``tqdm`` is
installed (never a dependency); ``DET_PROGRESS_BAR=0``/``1`` forces it off/on.
Without a bar the loop does not call ``batch_done`` at all (``draws``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Mapping, Optional

from determined_launch.pytorch._units import Batch, Epoch, TrainUnit
from determined_launch.values import plain_metrics as format_metrics

logger = logging.getLogger("determined_launch.pytorch")

_ENV_BAR = "DET_PROGRESS_BAR"


def _want_bar(is_chief: bool, use_tqdm: Optional[bool]) -> bool:
    if not is_chief:
        return False
    env = os.environ.get(_ENV_BAR, "").strip().lower()
    if use_tqdm is None and env in ("0", "1", "false", "true", "no", "yes", "off", "on"):
        use_tqdm = env in ("1", "true", "yes", "on")
    if use_tqdm is None:
        try:
            use_tqdm = sys.stderr is not None and sys.stderr.isatty()
        except (AttributeError, ValueError):
            use_tqdm = False
    return bool(use_tqdm)


class Progress:
    """Progress of one ``fit()`` on one rank.

    Call ``batch_done`` after every batch (cheap), ``training_report`` and
    ``validation_report`` when the chief reports, ``close`` at the end.
    """

    def __init__(
        self,
        max_length: Optional[TrainUnit],
        *,
        is_chief: bool,
        start_batch: int = 0,
        start_epoch: int = 0,
        epoch_len: Optional[int] = None,
        use_tqdm: Optional[bool] = None,
    ) -> None:
        self.max_length = max_length
        self.is_chief = is_chief
        self.epoch_len = epoch_len
        self._last_batches = start_batch
        self._last_time = time.monotonic()
        self._bar: Any = None
        self._bar_counts_epochs = False
        # The bar is drawn on the first batch, so a Progress built but never used
        # (or replaced) leaves nothing on the terminal.
        self._want_bar = _want_bar(is_chief, use_tqdm)
        self._start = (start_batch, start_epoch)

    def _make_bar(self, start_batch: int, start_epoch: int) -> Any:
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        total: Optional[int] = None
        initial = start_batch
        unit = "batch"
        if isinstance(self.max_length, Batch) and isinstance(self.max_length.value, int):
            total = self.max_length.value
        elif isinstance(self.max_length, Epoch) and isinstance(self.max_length.value, int):
            if self.epoch_len and self.epoch_len < sys.maxsize:
                total = self.max_length.value * self.epoch_len
            else:  # unsized loader: count epochs
                total, initial, unit = self.max_length.value, start_epoch, "epoch"
        self._bar_counts_epochs = unit == "epoch"
        return tqdm(
            total=total,
            initial=initial,
            unit=unit,
            dynamic_ncols=True,
            leave=False,
            file=sys.stderr,
        )

    @property
    def draws(self) -> bool:
        """Whether ``batch_done`` does anything (a bar is shown or will be)."""
        return self._want_bar or self._bar is not None

    def batch_done(self, batches_trained: int, epochs_trained: int) -> None:
        bar = self._bar
        if bar is None:
            if not self._want_bar:
                return
            self._want_bar = False
            bar = self._bar = self._make_bar(*self._start)
            if bar is None:
                return
        target = epochs_trained if self._bar_counts_epochs else batches_trained
        if target > bar.n:
            bar.update(target - bar.n)

    def _where(self, batches_trained: int, epochs_trained: int) -> str:
        text = f"batches={batches_trained} epochs={epochs_trained}"
        if self.max_length is not None and isinstance(self.max_length.value, int):
            done = batches_trained if isinstance(self.max_length, Batch) else epochs_trained
            if 0 < self.max_length.value < sys.maxsize:
                text += f" ({100.0 * done / self.max_length.value:.0f}%)"
        return text

    def _emit(self, line: str) -> None:
        bar = self._bar
        if bar is not None:
            bar.clear()  # so the log line is not printed through the bar
        logger.info("%s", line)
        if bar is not None:
            bar.refresh()

    def training_report(
        self, batches_trained: int, epochs_trained: int, metrics: Mapping[str, Any]
    ) -> str:
        """Log (chief) one line: position, batches/s since the last report, metrics."""
        now = time.monotonic()
        done = batches_trained - self._last_batches
        elapsed = now - self._last_time
        self._last_batches, self._last_time = batches_trained, now
        rate = f" {done / elapsed:.1f} batches/s" if elapsed > 0 and done > 0 else ""
        line = (
            f"training: {self._where(batches_trained, epochs_trained)}{rate}: "
            f"{format_metrics(metrics)}"
        )
        if self.is_chief:
            self._emit(line)
        return line

    def validation_report(
        self, batches_trained: int, epochs_trained: int, metrics: Mapping[str, Any]
    ) -> str:
        line = (
            f"validation: {self._where(batches_trained, epochs_trained)}: {format_metrics(metrics)}"
        )
        if self.is_chief:
            self._emit(line)
        return line

    def close(self) -> None:
        self._want_bar = False
        if self._bar is not None:
            self._bar.close()
            self._bar = None
