"""Per-slot and global batch sizes from ``hparams["global_batch_size"]``."""

from __future__ import annotations

import logging
from typing import Any, Optional

from determined_launch import errors

logger = logging.getLogger("determined_launch.pytorch")


def calculate_batch_sizes(hparams: Optional[dict[str, Any]], slots: int) -> tuple[int, int]:
    """``(per_slot, global)`` from ``hparams["global_batch_size"]`` and the rank count."""
    if not hparams or "global_batch_size" not in hparams:
        raise ValueError(
            "global_batch_size is not set: pass hparams={'global_batch_size': N, ...} to "
            "det.pytorch.init() (or set it under hyperparameters in the experiment config)"
        )
    gbs = hparams["global_batch_size"]
    if isinstance(gbs, bool) or not isinstance(gbs, int):
        raise errors.InvalidExperimentException(
            f"global_batch_size must be an integer, got {gbs!r}; "
            "set hparams['global_batch_size'] to an int"
        )
    slots = max(slots, 1)
    if gbs < slots:
        raise errors.InvalidExperimentException(
            f"global_batch_size ({gbs}) is smaller than the number of slots ({slots}); "
            "it must be at least one record per slot"
        )
    per_slot = gbs // slots
    effective = per_slot * slots
    if effective != gbs:
        logger.warning(
            "global_batch_size %d is not divisible by %d slots; using an effective global "
            "batch size of %d (%d per slot)", gbs, slots, effective, per_slot
        )
    return per_slot, effective


def shard_batch_size(size: int, global_batch_size: int) -> int:
    """Per-rank share of ``global_batch_size``, validated like ``init``'s."""
    return calculate_batch_sizes({"global_batch_size": global_batch_size}, size)[0]
