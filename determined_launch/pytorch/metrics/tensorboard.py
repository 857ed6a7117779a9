"""Optional TensorBoard output (FIX-7): a writer when a backend is installed, else nothing.

Upstream imports ``tensorboard`` unconditionally and writes ``./runs`` into the
code directory that every checkpoint copies. Here the writer goes where the
context says (``<run_dir>/tensorboard``), and with neither ``tensorboard`` nor
``tensorboardX`` installed training runs on after one warning.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, List, Mapping, Optional, Sequence

from determined_launch.pytorch.metrics.utils import is_numerical_scalar

logger = logging.getLogger("determined_launch.pytorch")

_warn_lock = threading.Lock()
_warned = False


def _summary_writer_class() -> Optional[Any]:
    """torch's SummaryWriter (needs the ``tensorboard`` package), else tensorboardX's."""
    try:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    except ImportError:
        pass
    try:
        from tensorboardX import SummaryWriter as SummaryWriterX

        return SummaryWriterX
    except ImportError:
        return None


def tensorboard_available() -> bool:
    return _summary_writer_class() is not None


def _warn_missing_once() -> None:
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    logger.warning(
        "TensorBoard logging is off: neither tensorboard nor tensorboardX is installed "
        "(pip install tensorboard to get event files); training continues."
    )


def make_writer(path: os.PathLike[str] | str) -> Optional[Any]:
    """A ``SummaryWriter`` writing under ``path``, or None (one warning) without a backend."""
    writer_cls = _summary_writer_class()
    if writer_cls is None:
        _warn_missing_once()
        return None
    os.makedirs(path, exist_ok=True)
    return writer_cls(os.fspath(path))


def _log_tb_metrics(
    writer: Any,
    metric_type: str,
    steps_completed: int,
    metrics: Mapping[str, Any],
    batch_metrics: Optional[Sequence[Mapping[str, Any]]] = None,
) -> None:
    """Write ``Determined/<name>`` scalars for one report.

    Batch metrics go at their own batch's step (the last one at
    ``steps_completed - 1``); metrics not among them (e.g. reducer results)
    go at ``steps_completed``, and for validation get a ``val_`` prefix unless
    their name starts with "val". Non-scalar values are skipped.
    """
    if metric_type not in ("train", "val"):
        logger.warning("Unrecognized tensorboard metric type: %s", metric_type, stacklevel=2)
    if writer is None:
        return
    seen = set()
    for idx, batch in enumerate(batch_metrics or []):
        step = steps_completed - len(batch_metrics or []) + idx
        for name, value in batch.items():
            if is_numerical_scalar(value):
                writer.add_scalar("Determined/" + name, value, step)
            seen.add(name)
    for name, value in metrics.items():
        if name in seen:
            continue
        if metric_type == "val" and not name.startswith("val"):
            name = "val_" + name
        if is_numerical_scalar(value):
            writer.add_scalar("Determined/" + name, value, steps_completed)


__all__: List[str] = ["_log_tb_metrics", "make_writer", "tensorboard_available"]


class NullWriter:
    """Stands in for a TensorBoard ``SummaryWriter`` when tensorboard is missing
    (FIX-7): every method is a no-op, so user logging code never crashes."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None
