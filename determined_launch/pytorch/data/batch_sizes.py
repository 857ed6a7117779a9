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


def _slots(n: int) -> str:
    return f"{n} slot" if n == 1 else f"{n} slots"


def resize_check(
    saved_slots: Optional[int], saved_global: Optional[int], slots: int,
    global_batch_size: Optional[int],
) -> Optional[str]:
    """The line to log when a checkpoint taken on ``saved_slots`` ranks resumes on
    ``slots``; ``None`` when the world is the same or the checkpoint does not say.

    The math continues only if the global batch stays what the checkpoint trained
    with (``saved_global``, the effective one): a ``global_batch_size`` that does
    not divide over the new slots, or that gives another effective batch, is a
    one-line ``InvalidExperimentException`` naming both numbers (no gradient
    accumulation makes up the difference).
    """
    if saved_slots is None or saved_slots == slots:
        return None
    slots = max(slots, 1)
    where = f"resuming on {_slots(slots)} from a checkpoint taken on {saved_slots}"
    if global_batch_size is None:
        return where  # the trial sizes its own batches: nothing to keep constant
    if global_batch_size % slots:
        raise errors.InvalidExperimentException(
            f"{where}: global_batch_size {global_batch_size} does not divide over "
            f"{_slots(slots)}, so the global batch would change; resume on a number of "
            f"slots that divides {global_batch_size}"
        )
    if saved_global is not None and saved_global != global_batch_size:
        raise errors.InvalidExperimentException(
            f"{where}: the checkpoint trained with a global batch of {saved_global} "
            f"(global_batch_size over {_slots(saved_slots)}) but {_slots(slots)} would use "
            f"{global_batch_size}; resume on {_slots(saved_slots)} or give the same "
            "global_batch_size"
        )
    return f"{where}: global batch {global_batch_size} → {global_batch_size // slots} per slot"
