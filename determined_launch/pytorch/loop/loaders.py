"""The loop's data: training and validation loaders built from the trial
(spec 3.12)."""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Iterator, Sized
from typing import Any, Optional

import torch
import torch.utils.data as tud

from determined_launch import errors
from determined_launch.pytorch.api.trial import (
    _evaluate_batch_defined,
    _evaluate_full_dataset_defined,
)
from determined_launch.pytorch.data.loader import DataLoader, _dataset_repro_warning

logger = logging.getLogger("determined_launch.pytorch")


def _checked_loader(context: Any, data: Any, builder: str) -> Any:
    """A torch loader from a non-det loader, after the reproducibility check."""
    if not context.experimental._data_repro_checks_disabled:
        raise RuntimeError(_dataset_repro_warning(builder, data))
    return data


def build_loaders(trial: Any, context: Any, steps_completed: int) -> tuple[Any, Optional[Any]]:
    """``(training_loader, validation_loader)``; sets ``context._epoch_len`` (the
    chief's, on every rank). The training loader repeats, is sharded and skips
    the ``steps_completed`` batches already trained; validation is sharded
    for ``evaluate_batch``, the chief's alone for ``evaluate_full_dataset``."""
    dist = context.distributed
    is_chief = dist.rank == 0
    seed = context._trial_seed
    train_data = trial.build_training_data_loader()
    if isinstance(train_data, DataLoader):
        training_loader = train_data.get_data_loader(
            repeat=True, skip=steps_completed, num_replicas=dist.size, rank=dist.rank,
            seed=seed,
        )
    else:
        training_loader = _checked_loader(context, train_data, "build_training_data_loader")
    if context._resized_from is not None and is_chief:
        _warn_inexact_resize(context, train_data)
    try:
        epoch_len = len(training_loader)
    except TypeError:
        epoch_len = sys.maxsize
    epoch_len = dist.broadcast(epoch_len)
    if epoch_len < 1:
        raise ValueError(
            "the training data loader is empty (0 batches per rank): give the dataset at "
            "least global_batch_size records (and drop_last=False if it is shorter)"
        )
    context._epoch_len = epoch_len

    validation_loader = None
    val_data = trial.build_validation_data_loader()
    sharded = _evaluate_batch_defined(trial)
    if isinstance(val_data, DataLoader):
        if sharded:
            validation_loader = val_data.get_data_loader(
                repeat=False, skip=0, num_replicas=dist.size, rank=dist.rank, seed=seed
            )
        elif is_chief:
            validation_loader = val_data.get_data_loader(
                repeat=False, skip=0, num_replicas=1, rank=0, seed=seed
            )
    elif sharded or is_chief:
        validation_loader = _checked_loader(context, val_data, "build_validation_data_loader")
    return training_loader, validation_loader


def _warn_inexact_resize(context: Any, train_data: Any) -> None:
    """Resumed on another world size: say when the stream cannot stay the same.

    Our loader's global batch ``k`` is records ``k*G .. k*G+G-1`` of the epoch's
    order, split over the ranks, whatever their number, as long as an epoch holds
    a multiple of ``G`` records; otherwise the epoch's short last batch is cut into
    per-slot batches differently, and every later batch shifts.
    """
    slots = f"{context.distributed.size} slot" + ("s" if context.distributed.size > 1 else "")
    if not isinstance(train_data, DataLoader):
        logger.warning(
            "the training loader is not a det.pytorch.DataLoader: continuing the same "
            "sample stream on %s (sharding, skipping) is the trial's own", slots,
        )
        return
    gbs = context._global_batch_size
    batches = train_data.batch_sampler
    if gbs is None or not isinstance(batches, tud.BatchSampler):
        return
    if isinstance(batches.sampler, Sized) and len(batches.sampler) % gbs:
        logger.warning(
            "the training data has %d records per epoch, not a multiple of the global "
            "batch %d: the short last batch of an epoch is cut into per-slot batches "
            "differently on %s than on %d, so the records of later global batches are not "
            "those a run on %d would have trained on",
            len(batches.sampler), gbs, slots, context._resized_from, context._resized_from,
        )


def enumerated(pairs: Iterator[tuple[int, Any]]) -> tuple[Optional[int], Iterator[Any]]:
    """Determined's ``training_enumerator`` seam (``enumerate(iterator)``): the
    first pair's batch index (None when there is none) and the batches of all
    pairs, read lazily so that the iterator the pairs come from loses none."""
    first = next(pairs, None)
    if first is None:
        return None, iter(())
    return first[0], itertools.chain((first[1],), (batch for _, batch in pairs))


def check_setup(trial: Any, context: Any) -> None:
    """What the loop needs before it starts: a wrapped model and optimizer,
    exactly one evaluate method, and a process group when several ranks run."""
    if not context.models:
        raise errors.InvalidExperimentException(
            "Must have at least one model. "
            "This might be caused by not wrapping your model with wrap_model()."
        )
    if not context.optimizers:
        raise errors.InvalidExperimentException(
            "Must have at least one optimizer. "
            "This might be caused by not wrapping your optimizer with wrap_optimizer()."
        )
    if _evaluate_batch_defined(trial) == _evaluate_full_dataset_defined(trial):
        raise errors.InvalidExperimentException(
            "Please define exactly one of: `evaluate_batch()` or `evaluate_full_dataset()`. "
            "For most use cases `evaluate_batch()` is recommended because "
            "it can be parallelized across all devices."
        )
    if context.distributed.size > 1 and not (
        torch.distributed.is_available() and torch.distributed.is_initialized()
    ) and not context._use_horovod:
        raise errors.InvalidExperimentException(
            f"{context.distributed.size} ranks but no torch process group: run under "
            "`det-launch torch --` or torchrun and create the context with "
            "det.pytorch.init() (it starts the process group), or call "
            "torch.distributed.init_process_group() yourself"
        )
