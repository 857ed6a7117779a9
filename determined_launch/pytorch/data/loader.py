"""Determined's ``DataLoader`` and the data helpers (``to_device``, ``data_length``).

``DataLoader`` takes ``torch.utils.data.DataLoader``'s arguments but builds the
torch loader only in ``get_data_loader(repeat, skip, num_replicas, rank)``, so
the training loop can make the stream endless, shard it across ranks and skip
what a resumed run already trained on.

Deterministic shuffle (FIX-2): with ``shuffle=True`` epoch ``e`` is the
permutation drawn from a generator seeded with ``(seed, e)``, where ``seed`` is
the user's ``generator`` seed if one was given, else the ``seed`` the loop
passes (the trial seed). Upstream draws each epoch's order from the global RNG
when the epoch starts, so a run resumed mid-epoch saw a different order.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Sized, Type, Union

import numpy as np
import torch
import torch.utils.data as tud
from torch.utils.data._utils import collate as _collate

from determined_launch import errors
from determined_launch.pytorch import samplers

logger = logging.getLogger("determined_launch.pytorch")

_Array = Union[np.ndarray, torch.Tensor]
_Data = Union[Dict[str, _Array], Sequence[_Array], _Array]
TorchData = Union[Dict[str, torch.Tensor], Sequence[torch.Tensor], torch.Tensor]

_DISABLE_HINT = "context.experimental.disable_dataset_reproducibility_checks()"


def _dataset_repro_warning(fn: str, data_obj: Any, is_deepspeed_trial: bool = False) -> str:
    """The message for a loader that is not a ``det.pytorch.DataLoader`` (spec 3.12)."""
    how = _DISABLE_HINT
    if is_deepspeed_trial:
        how = "context.disable_dataset_reproducibility_checks()"
    return (
        f"{fn}() returned an instance of {type(data_obj).__name__}, which is not a "
        "subclass of det.pytorch.DataLoader. For map-style datasets det.pytorch.DataLoader "
        "is a drop-in replacement for torch.utils.data.DataLoader that repeats, shards and "
        "resumes the data stream exactly; use it if you can. If not, you can disable this "
        f"check by calling {how} in your trial's __init__() and handle repeating, sharding "
        "and skipping yourself."
    )


def _mix_seed(*parts: int) -> int:
    """A well-mixed 64-bit seed from several ints (e.g. trial seed and epoch)."""
    entropy = [int(p) % (1 << 64) for p in parts]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0])


class _EpochShuffleSampler(tud.RandomSampler):
    """A ``RandomSampler`` whose pass ``e`` is the permutation seeded by ``(seed, e)``.

    Each ``iter()`` is one epoch and advances ``epoch``. The base seed is the
    user's generator's ``initial_seed()`` if given, else ``seed``, else (nothing
    known, e.g. a plain ``for batch in loader``) ``torch.initial_seed()``.
    """

    def __init__(self, data_source: Sized, generator: Optional[torch.Generator] = None) -> None:
        super().__init__(data_source, generator=generator)
        self.seed: Optional[int] = None
        self.epoch = 0
        self.advance = True  # False: every pass is ``epoch`` (deterministic validation)

    def base_seed(self) -> int:
        if self.generator is not None:
            return int(self.generator.initial_seed())
        if self.seed is not None:
            return self.seed
        return int(torch.initial_seed())

    def permutation(self, epoch: int) -> List[int]:
        gen = torch.Generator()
        gen.manual_seed(_mix_seed(self.base_seed(), epoch))
        return torch.randperm(len(self.data_source), generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch
        if self.advance:
            self.epoch += 1
        return iter(self.permutation(epoch))

    def __len__(self) -> int:
        return len(self.data_source)

    def fresh(self, seed: Optional[int], advance: bool = True) -> _EpochShuffleSampler:
        """A copy starting at epoch 0: every stream the loop builds starts at the run's start."""
        other = copy.copy(self)
        other.epoch = 0
        other.advance = advance
        if seed is not None:
            other.seed = seed
        return other


class DataLoader:
    """``torch.utils.data.DataLoader``'s arguments, built lazily by ``get_data_loader``.

    Only map-style datasets (the sampler chain needs indices). Iterating it
    directly (``for batch in loader``) gives one pass, as a torch loader would.
    """

    def __init__(
        self,
        dataset: tud.Dataset,
        batch_size: Optional[int] = 1,
        shuffle: bool = False,
        sampler: Optional[Any] = None,
        batch_sampler: Optional[Any] = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
    ) -> None:
        if isinstance(dataset, tud.IterableDataset):
            raise ValueError(
                "IterableDatasets are not supported through det.pytorch.DataLoader(), which "
                "needs indices to repeat, shard and skip. Return a torch.utils.data.DataLoader "
                f"instead and call {_DISABLE_HINT}; you then shuffle, shard, repeat and skip "
                "yourself."
            )
        if batch_sampler is None and batch_size is None:
            raise ValueError(
                "batch_size=None with batch_sampler=None (no auto-batching) is not supported "
                "by det.pytorch.DataLoader(); give a batch_size or a batch_sampler"
            )
        if num_workers < 0:
            raise ValueError(
                f"num_workers option should be non-negative, got {num_workers}; "
                "use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError(f"timeout option should be non-negative, got {timeout}")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing; "
                "set num_workers > 0 to enable multiprocessing."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError(
                f"prefetch_factor option should be non-negative, got {prefetch_factor}"
            )
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size not in (1, None) or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and (shuffle or drop_last):
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with shuffle, and drop_last"
            )

        if sampler is None:
            if shuffle:
                sampler = _EpochShuffleSampler(dataset, generator=generator)  # type: ignore[arg-type]
            else:
                sampler = tud.SequentialSampler(dataset)  # type: ignore[arg-type]
        if batch_size is not None and batch_sampler is None:
            batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.persistent_workers = persistent_workers
        if collate_fn is None:
            collate_fn = (
                _collate.default_collate if self._auto_collation else _collate.default_convert
            )
        self.collate_fn = collate_fn

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    def _base_batch_sampler(self, seed: Optional[int], advance: bool) -> Any:
        # Our own shuffle gets a fresh copy so that every stream starts at epoch 0
        # (a resumed run then re-derives the same epochs before skipping).
        ours = self.batch_sampler
        if (
            isinstance(self.sampler, _EpochShuffleSampler)
            and isinstance(ours, tud.BatchSampler)
            and ours.sampler is self.sampler
        ):
            sampler = self.sampler.fresh(seed, advance)
            return tud.BatchSampler(sampler, ours.batch_size, ours.drop_last)
        return self.batch_sampler

    def get_data_loader(
        self,
        repeat: bool = False,
        skip: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        *,
        seed: Optional[int] = None,
    ) -> tud.DataLoader:
        """Build the torch loader: repeat (training), shard over ranks, skip resumed batches.

        ``skip`` counts this rank's batches. ``seed`` (keyword-only, an
        extension) is the trial seed the loop passes: it fixes the shuffle order
        of every epoch and the loader's worker seeds, without touching the
        global RNG. With ``seed`` and ``repeat=False`` every pass has epoch 0's
        order (validation streams are independent of history).
        """
        batch_sampler = adapt_batch_sampler(
            # The loop's one-pass (validation) streams use epoch 0's order on every
            # pass, so validation does not depend on how many ran before a resume.
            self._base_batch_sampler(seed, advance=repeat or seed is None),
            repeat=repeat,
            skip=skip,
            num_replicas=num_replicas,
            rank=rank,
        )
        return self._torch_loader(batch_sampler, seed)

    def _torch_loader(self, batch_sampler: Any, seed: Optional[int]) -> tud.DataLoader:
        generator = self.generator
        if generator is None and seed is not None:
            # A private generator: the loader's per-iterator base seed is then drawn
            # from it instead of from the global torch RNG, which checkpoints restore.
            generator = torch.Generator()
            generator.manual_seed(_mix_seed(seed, 0x10AD))
        return tud.DataLoader(
            self.dataset,
            batch_sampler=batch_sampler,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            worker_init_fn=self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context,
            generator=generator,
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers,
        )

    def __iter__(self) -> Iterator[Any]:
        # Direct iteration (outside the loop): successive passes are successive epochs.
        return iter(self._torch_loader(self.batch_sampler, None))

    def __len__(self) -> int:
        if not isinstance(self.batch_sampler, Sized):
            raise TypeError("this DataLoader's batch_sampler has no len()")
        return len(self.batch_sampler)


def adapt_batch_sampler(
    batch_sampler: Any,
    repeat: bool = False,
    skip: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
) -> Any:
    """Chain a batch sampler: repeat, then shard round-robin, then skip.

    Skipping comes last because ``skip`` counts the batches this rank already
    trained on, i.e. batches after sharding.
    """
    if repeat:
        batch_sampler = samplers.RepeatBatchSampler(batch_sampler)
    if num_replicas > 1:
        batch_sampler = samplers.DistributedBatchSampler(batch_sampler, num_replicas, rank)
    if skip > 0:
        batch_sampler = samplers.SkipBatchSampler(batch_sampler, skip)
    return batch_sampler


def data_length(data: _Data) -> int:
    """The batch size of a batch: ``len`` of a tensor/array, or of the first item of a container."""
    if isinstance(data, (np.ndarray, torch.Tensor)):
        return len(data)
    if isinstance(data, dict):
        if not data:
            raise ValueError("a batch dict must hold at least one np.ndarray or torch.Tensor")
        return len(next(iter(data.values())))
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError(
                f"a batch {type(data).__name__} must hold at least one np.ndarray or torch.Tensor"
            )
        return len(data[0])
    raise TypeError(f"Data of incorrect type: {type(data)}")


def _cpu_tensors(data: Any) -> bool:
    """``data`` is a CPU tensor, or a tuple, list or dict of CPU tensors."""
    kind = type(data)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return bool(data.is_cpu)
    if kind is tuple or kind is list:
        values: Any = data
    elif kind is dict:
        values = data.values()
    else:
        return False
    for value in values:
        if type(value) is not torch.Tensor or not value.is_cpu:
            return False
    return True


def local_gpu(local_rank: int, local_ranks: int) -> int:
    """The GPU of this rank: one per rank, by local rank, as NCCL needs (it
    refuses two ranks on one GPU). More ranks on a node than visible GPUs is a
    launch mistake (``--slots`` above the GPU count), named here instead of
    CUDA's "invalid device ordinal" on some ranks."""
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise errors.InvalidExperimentException(
            f"local rank {local_rank} has no GPU of its own: {local_ranks} ranks on this node but "
            f"{count} visible GPU(s); start one rank per GPU (leave --slots out) or hide the "
            "GPUs (CUDA_VISIBLE_DEVICES=) to train on CPU"
        )
    return local_rank


def to_device(
    data: _Data, device: Union[str, torch.device], warned_types: Optional[Set[Type]] = None
) -> TorchData:
    """Move a batch to ``device``: containers recursively, arrays via ``torch.from_numpy``.

    Anything that cannot move is returned unchanged, with one warning per type.
    """
    # Runs on every batch: tensors first, and no set built unless something warns.
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if warned_types is None and isinstance(data, (tuple, list, dict)):
        warned_types = set()  # shared by the whole batch: one warning per type
    if isinstance(data, tuple):
        return tuple([to_device(x, device, warned_types) for x in data])  # type: ignore[misc]
    if isinstance(data, list):
        return [to_device(x, device, warned_types) for x in data]  # type: ignore[misc]
    if isinstance(data, dict):
        return {k: to_device(v, device, warned_types) for k, v in data.items()}  # type: ignore[misc]
    if isinstance(data, np.ndarray):
        # torch has float, complex, int, uint and bool tensors; other kinds stay arrays.
        if data.dtype.kind in "fciub":
            return torch.from_numpy(data).to(device)
    else:
        move = getattr(data, "to", None)
        if callable(move):
            return move(device)
    if warned_types is None:
        warned_types = set()
    if type(data) not in warned_types:
        warned_types.add(type(data))
        logger.warning(f"Was not able to move data item of type '{type(data).__name__}' to device.")
    return data  # type: ignore[return-value]
