"""Sampler building blocks: repeat, shard, skip and reproducibly shuffle a sampler.

These wrap a sampler (of indices) or a batch sampler (of index lists) and are
chained by ``adapt_batch_sampler``: repeat first (training streams are
endless), then shard round-robin across ranks, then skip the batches a resumed
run already trained on. Shuffle before any of them.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, List, Sized

import numpy as np
import torch.utils.data


def _sized_len(obj: Any, what: str) -> int:
    if not isinstance(obj, Sized):
        raise TypeError(f"{what} {type(obj).__name__} has no len(); wrap a sized sampler")
    return len(obj)


def _check_shard(num_workers: int, rank: int) -> None:
    if rank < 0:
        raise ValueError(f"rank must be non-negative, got rank={rank}")
    if num_workers <= 0:
        raise ValueError(f"num_workers must be greater than zero, got num_workers={num_workers}")
    if rank >= num_workers:
        raise ValueError(
            f"rank must be less than num_workers, got rank={rank} num_workers={num_workers}"
        )


def _check_skip(skip: int) -> None:
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")


# The chains below are itertools objects, not generators: a training batch's
# index list then passes through no Python frame of ours (each one costs 1-3 µs
# between two model steps; BENCHMARKS.md, Trainer overhead).


def _round_robin(items: Iterable[Any], num_workers: int, rank: int) -> Iterator[Any]:
    return itertools.islice(items, rank, None, num_workers)


def _shard_len(total: int, num_workers: int, rank: int) -> int:
    # Rank r gets items r, r+w, r+2w, ...: the first n % w ranks get one more.
    return total // num_workers + int(total % num_workers > rank)


def _skip_first(items: Iterable[Any], skip: int) -> Iterator[Any]:
    return itertools.islice(items, skip, None)


def _forever(items: Iterable[Any]) -> Iterator[Any]:
    """``items``' items, pass after pass (a new ``iter(items)`` per pass)."""
    return itertools.chain.from_iterable(itertools.repeat(items))


class RepeatSampler(torch.utils.data.Sampler):
    """Iterate the wrapped sampler forever; ``len`` is the wrapped sampler's."""

    def __init__(self, sampler: Any) -> None:
        self._sampler = sampler

    def __len__(self) -> int:
        return _sized_len(self._sampler, "RepeatSampler's sampler")

    def __iter__(self) -> Iterator[Any]:
        return _forever(self._sampler)


class RepeatBatchSampler(torch.utils.data.BatchSampler):
    """Iterate the wrapped batch sampler forever; ``len`` is the wrapped one's."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        return _sized_len(self.batch_sampler, "RepeatBatchSampler's batch_sampler")

    def __iter__(self) -> Iterator[List[int]]:
        return _forever(self.batch_sampler)


class DistributedSampler(torch.utils.data.Sampler):
    """Rank ``rank`` of ``num_workers`` gets items ``rank, rank+num_workers, ...``.

    Unlike ``torch.utils.data.DistributedSampler`` it neither shuffles nor pads:
    it is one link in a chain, wrapping any (possibly repeating) sampler.
    """

    def __init__(self, sampler: Any, num_workers: int, rank: int) -> None:
        _check_shard(num_workers, rank)
        self._sampler = sampler
        self._num_workers = num_workers
        self._rank = rank

    def __len__(self) -> int:
        total = _sized_len(self._sampler, "DistributedSampler's sampler")
        return _shard_len(total, self._num_workers, self._rank)

    def __iter__(self) -> Iterator[Any]:
        return _round_robin(self._sampler, self._num_workers, self._rank)


class DistributedBatchSampler(torch.utils.data.BatchSampler):
    """Rank ``rank`` of ``num_workers`` gets batches ``rank, rank+num_workers, ...``.

    Applied after the batch sampler, so each rank's batch has the per-slot size
    and a global batch is the ``num_workers`` consecutive batches.
    """

    def __init__(self, batch_sampler: Any, num_workers: int, rank: int) -> None:
        _check_shard(num_workers, rank)
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.rank = rank

    def __len__(self) -> int:
        total = _sized_len(self.batch_sampler, "DistributedBatchSampler's batch_sampler")
        return _shard_len(total, self.num_workers, self.rank)

    def __iter__(self) -> Iterator[List[int]]:
        return _round_robin(self.batch_sampler, self.num_workers, self.rank)


class SkipSampler(torch.utils.data.Sampler):
    """Drop the first ``skip`` items; ``len`` stays the wrapped sampler's.

    Resume by batches (``SkipBatchSampler``) rather than by records unless every
    batch is known to have the same size.
    """

    def __init__(self, sampler: Any, skip: int) -> None:
        _check_skip(skip)
        self._sampler = sampler
        self._skip = skip

    def __len__(self) -> int:
        return _sized_len(self._sampler, "SkipSampler's sampler")

    def __iter__(self) -> Iterator[Any]:
        return _skip_first(self._sampler, self._skip)


class SkipBatchSampler(torch.utils.data.BatchSampler):
    """Drop the first ``skip`` batches; ``len`` stays the wrapped batch sampler's.

    The length is not reduced because the stream it wraps is a repeating
    training stream: the epoch length must not change after a resume.
    """

    def __init__(self, batch_sampler: Any, skip: int) -> None:
        _check_skip(skip)
        self.batch_sampler = batch_sampler
        self.skip = skip

    def __len__(self) -> int:
        return _sized_len(self.batch_sampler, "SkipBatchSampler's batch_sampler")

    def __iter__(self) -> Iterator[List[int]]:
        return _skip_first(self.batch_sampler, self.skip)


class ReproducibleShuffleSampler(torch.utils.data.Sampler):
    """Shuffle the wrapped sampler's items with ``np.random.RandomState(seed)``.

    The RandomState lives as long as this object, so successive passes get
    successive (reproducible) permutations. Shuffle before repeating or skipping.
    """

    def __init__(self, sampler: Any, seed: int) -> None:
        self._sampler = sampler
        self._rng = np.random.RandomState(seed)

    def __len__(self) -> int:
        return _sized_len(self._sampler, "ReproducibleShuffleSampler's sampler")

    def __iter__(self) -> Iterator[Any]:
        items = list(self._sampler)
        self._rng.shuffle(items)
        return iter(items)


class ReproducibleShuffleBatchSampler(torch.utils.data.Sampler):
    """``ReproducibleShuffleSampler`` over whole batches (batch contents stay fixed)."""

    def __init__(self, batch_sampler: Any, seed: int) -> None:
        self._batch_sampler = batch_sampler
        self._rng = np.random.RandomState(seed)

    def __len__(self) -> int:
        return _sized_len(self._batch_sampler, "ReproducibleShuffleBatchSampler's batch_sampler")

    def __iter__(self) -> Iterator[Any]:
        batches = list(self._batch_sampler)
        self._rng.shuffle(batches)
        return iter(batches)


__all__ = [
    "DistributedBatchSampler",
    "DistributedSampler",
    "RepeatBatchSampler",
    "RepeatSampler",
    "ReproducibleShuffleBatchSampler",
    "ReproducibleShuffleSampler",
    "SkipBatchSampler",
    "SkipSampler",
]
