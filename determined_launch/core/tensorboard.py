"""TensorBoard event files for the local Core API.

In ``TensorboardMode.AUTO`` the chief writes every reported training and
validation metric (tags ``training/<name>``, ``validation/<name>``,
``<group>/<name>``) into ``<run_dir>/tensorboard/``; with object storage it
also syncs new or changed files to ``<storage>/tensorboard/<run name>/``, so
``tensorboard --logdir s3://bucket/prefix/tensorboard`` shows every run. A
directory storage is not synced automatically: the run directories already
hold the files (``tensorboard --logdir det_runs``). In ``MANUAL`` mode
nothing is written; ``upload_tensorboard_files()`` copies what you wrote
into ``get_tensorboard_path()`` to the storage, whatever its kind.

The event files are written by ``core.event_file`` with the standard library
alone: no ``tensorboard`` package (its import costs 0.7-1.4 s of CPU in every
reporting process), no torch.
"""

from __future__ import annotations

import enum
import logging
import numbers
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

from determined_launch.core.event_file import EventFileWriter

logger = logging.getLogger("determined_launch.core")

#: Directory under the storage root holding every run's TensorBoard files.
STORAGE_DIR = "tensorboard"
_SYNC_INTERVAL = 1.0  # at most one upload per second: cloud request quotas


class TensorboardMode(enum.Enum):
    """Determined's names. ``AUTO``: metrics are written and uploaded for you.
    ``MANUAL``: nothing is written; call ``upload_tensorboard_files()``."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


class TensorboardManager:
    """Writes metrics as event files and syncs the directory to storage."""

    def __init__(self, base_path: pathlib.Path, mode: TensorboardMode, *,
                 upload: Optional[Callable[[str, pathlib.Path], None]], rank: int,
                 auto_sync: bool = True) -> None:
        self.base_path = base_path
        self.mode = TensorboardMode(mode)
        self._upload = upload
        #: AUTO mode syncs to storage (object stores); MANUAL uploads always do
        self._auto_sync = auto_sync
        self._rank = rank
        self._writer: Optional[EventFileWriter] = None
        self._synced: dict[pathlib.Path, tuple[int, int]] = {}
        self._last_sync = 0.0
        #: other syncs to storage that end with this one (the run's records)
        self.on_close: list[Callable[[], None]] = []

    def _get_writer(self) -> EventFileWriter:
        if self._writer is None:
            self.base_path.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.base_path))
        return self._writer

    def on_report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """AUTO mode, chief only: one scalar per numeric metric, then a sync."""
        if self.mode is not TensorboardMode.AUTO or self._rank != 0:
            return
        writer = self._get_writer()
        for name, value in metrics.items():
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                writer.add_scalar(f"{group}/{name}", float(value), steps_completed)
            elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
                writer.add_scalar(f"{group}/{name}", float(value.item()), steps_completed)
        writer.flush()
        self.sync_as_auto()

    def sync_as_auto(self, *, force: bool = False) -> None:
        """AUTO's sync after a report (chief): new or changed files to object
        storage, at most once a second unless ``force``; a directory storage
        reads them in place. Also for a framework on core that writes its own
        event files in MANUAL mode (the PyTorch Trainer). Plots never stop
        training: a failure is a warning, retried at the next sync."""
        if self._rank != 0 or not self._auto_sync:
            return
        try:
            self.sync(force=force)
        except Exception as e:  # noqa: BLE001
            logger.warning("TensorBoard sync to storage failed: %s", e)

    def sync(
        self,
        selector: Callable[[pathlib.Path], bool] = lambda _: True,
        mangler: Callable[[pathlib.Path, int], pathlib.Path] = lambda p, __: p,
        *,
        force: bool = False,
    ) -> list[str]:
        """Upload files new or changed since the last sync; returns their storage names."""
        if self._upload is None or not self.base_path.is_dir():
            return []
        now = time.monotonic()
        if not force and now - self._last_sync < _SYNC_INTERVAL:
            return []
        self._last_sync = now
        sent = []
        for path in sorted(self.base_path.rglob("*")):
            if not path.is_file() or not selector(path):
                continue
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            if self._synced.get(path) == stamp:
                continue
            name = mangler(path.relative_to(self.base_path), self._rank).as_posix()
            self._upload(name, path)
            self._synced[path] = stamp
            sent.append(name)
        return sent

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.mode is TensorboardMode.AUTO:
            self.sync_as_auto(force=True)
        for close in self.on_close:
            close()
