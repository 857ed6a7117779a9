"""TensorBoard event files for the local Core API (optional: tensorboardX or
torch's writer with the ``tensorboard`` package; neither is a dependency).

In ``TensorboardMode.AUTO`` the chief writes every reported training and
validation metric (tags ``training/<name>``, ``validation/<name>``,
``<group>/<name>``) into ``<run_dir>/tensorboard/`` and, with object storage,
syncs new or changed files to ``<checkpoint storage>/tensorboard/<run name>/``, so
``tensorboard --logdir s3://bucket/prefix/tensorboard`` shows every run. In
``MANUAL`` mode nothing is written; ``upload_tensorboard_files()`` syncs what
you wrote into ``get_tensorboard_path()``.
"""

from __future__ import annotations

import enum
import logging
import numbers
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

logger = logging.getLogger("determined_launch.core")

#: Directory under the storage root holding every run's TensorBoard files.
STORAGE_DIR = "tensorboard"
_SYNC_INTERVAL = 1.0  # at most one upload per second: cloud request quotas


class TensorboardMode(enum.Enum):
    """Determined's names. ``AUTO``: metrics are written and uploaded for you.
    ``MANUAL``: nothing is written; call ``upload_tensorboard_files()``."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


def _writer_class() -> Optional[Callable[..., Any]]:
    try:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    except ImportError:
        pass
    try:
        import tensorboard  # noqa: F401  (torch's writer needs it)
        from torch.utils.tensorboard import SummaryWriter as TorchWriter

        return TorchWriter
    except ImportError:
        return None


class TensorboardManager:
    """Writes metrics as event files and syncs the directory to storage."""

    def __init__(self, base_path: pathlib.Path, mode: TensorboardMode, *,
                 upload: Optional[Callable[[str, pathlib.Path], None]], rank: int,
                 auto_sync: bool = True) -> None:
        self.base_path = base_path
        # A directory storage is local like the run directory: AUTO mode
        # leaves the event files there instead of copying them.
        self._auto_sync = auto_sync
        self.mode = TensorboardMode(mode)
        self._upload = upload
        self._rank = rank
        self._writer: Any = None
        self._writer_missing = False
        self._synced: dict[pathlib.Path, tuple[int, int]] = {}
        self._last_sync = 0.0

    def _get_writer(self) -> Any:
        if self._writer is None and not self._writer_missing:
            cls = _writer_class()
            if cls is None:
                self._writer_missing = True
                logger.info("TensorBoard event files are off: pip install tensorboardX "
                            "(or tensorboard) to write them")
                return None
            self.base_path.mkdir(parents=True, exist_ok=True)
            self._writer = cls(str(self.base_path))
        return self._writer

    def on_report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """AUTO mode, chief only: one scalar per numeric metric, then a sync."""
        if self.mode is not TensorboardMode.AUTO or self._rank != 0:
            return
        writer = self._get_writer()
        if writer is None:
            return
        for name, value in metrics.items():
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                writer.add_scalar(f"{group}/{name}", float(value), steps_completed)
            elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
                writer.add_scalar(f"{group}/{name}", float(value.item()), steps_completed)
        writer.flush()
        if self._auto_sync:
            try:
                self.sync()
            except Exception as e:  # plots never stop training; retried at the next report
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
        if self.mode is TensorboardMode.AUTO and self._rank == 0 and self._auto_sync:
            try:
                self.sync(force=True)
            except Exception as e:  # never fail a finished run over its plots
                logger.warning("TensorBoard sync at exit failed: %s", e)
