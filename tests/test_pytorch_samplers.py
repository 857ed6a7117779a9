"""det.pytorch.samplers: the exact orders of spec section 7 and the chain semantics."""

from __future__ import annotations

import itertools

import pytest
from torch.utils.data import BatchSampler, SequentialSampler

from determined_launch.pytorch import samplers


def take(iterable: object, n: int) -> list:
    return list(itertools.islice(iterable, n))  # type: ignore[call-overload]


def test_reproducible_shuffle_sampler_orders() -> None:
    s = samplers.ReproducibleShuffleSampler(range(5), 777)
    assert list(s) == [0, 4, 1, 2, 3]
    assert list(s) == [2, 0, 1, 3, 4]  # the RNG persists across passes
    assert len(s) == 5
    again = samplers.ReproducibleShuffleSampler(range(5), 777)
    assert list(again) == [0, 4, 1, 2, 3]


def test_reproducible_shuffle_of_batches() -> None:
    s = samplers.ReproducibleShuffleSampler(BatchSampler(range(10), 2, False), 777)
    assert list(s) == [[0, 1], [8, 9], [2, 3], [4, 5], [6, 7]]
    assert list(s) == [[4, 5], [0, 1], [2, 3], [6, 7], [8, 9]]
    b = samplers.ReproducibleShuffleBatchSampler(BatchSampler(range(10), 2, False), 777)
    assert list(b) == [[0, 1], [8, 9], [2, 3], [4, 5], [6, 7]]
    assert len(b) == 5


def test_distributed_batch_sampler_19_items_4_ranks() -> None:
    base = BatchSampler(range(19), 2, False)
    got = [list(samplers.DistributedBatchSampler(base, 4, r)) for r in range(4)]
    assert got == [
        [[0, 1], [8, 9], [16, 17]],
        [[2, 3], [10, 11], [18]],
        [[4, 5], [12, 13]],
        [[6, 7], [14, 15]],
    ]
    assert [len(samplers.DistributedBatchSampler(base, 4, r)) for r in range(4)] == [3, 3, 2, 2]


def test_distributed_sampler_round_robin_and_len() -> None:
    got = [list(samplers.DistributedSampler(range(10), 3, r)) for r in range(3)]
    assert got == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [len(samplers.DistributedSampler(range(10), 3, r)) for r in range(3)] == [4, 3, 3]
    assert list(samplers.DistributedSampler(range(4), 1, 0)) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "num_workers, rank, message",
    [(2, -1, "rank must be non-negative"), (0, 0, "greater than zero"), (2, 2, "less than")],
)
def test_shard_validation(num_workers: int, rank: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        samplers.DistributedSampler(range(4), num_workers, rank)
    with pytest.raises(ValueError, match=message):
        samplers.DistributedBatchSampler(BatchSampler(range(4), 1, False), num_workers, rank)


def test_repeat_is_endless_and_keeps_len() -> None:
    r = samplers.RepeatSampler(range(3))
    assert take(r, 7) == [0, 1, 2, 0, 1, 2, 0]
    assert len(r) == 3
    rb = samplers.RepeatBatchSampler(BatchSampler(range(5), 2, False))
    assert take(rb, 4) == [[0, 1], [2, 3], [4], [0, 1]]
    assert len(rb) == 3


def test_skip_keeps_len_and_stops_when_short() -> None:
    s = samplers.SkipSampler(range(6), 4)
    assert list(s) == [4, 5] and len(s) == 6
    assert list(samplers.SkipSampler(range(3), 10)) == []
    sb = samplers.SkipBatchSampler(BatchSampler(range(6), 2, False), 1)
    assert list(sb) == [[2, 3], [4, 5]] and len(sb) == 3
    with pytest.raises(ValueError, match="skip must be >= 0"):
        samplers.SkipSampler(range(3), -1)


def test_chain_repeat_shard_skip_resumes_each_rank_exactly() -> None:
    # Skip counts per-rank batches after sharding: rank r resumed after k batches
    # continues with the same batches as an uninterrupted rank r.
    base = BatchSampler(SequentialSampler(range(10)), 2, False)  # 5 batches per epoch
    for rank in range(2):
        whole = take(
            samplers.DistributedBatchSampler(samplers.RepeatBatchSampler(base), 2, rank), 12
        )
        resumed = take(
            samplers.SkipBatchSampler(
                samplers.DistributedBatchSampler(samplers.RepeatBatchSampler(base), 2, rank), 7
            ),
            5,
        )
        assert resumed == whole[7:]
    assert take(samplers.DistributedBatchSampler(samplers.RepeatBatchSampler(base), 2, 1), 3) == [
        [2, 3],
        [6, 7],
        [0, 1],
    ]


def test_unsized_inner_sampler_len_raises_type_error() -> None:
    def gen() -> object:
        yield from range(3)

    with pytest.raises(TypeError, match="no len"):
        len(samplers.RepeatSampler(gen()))


def test_public_names() -> None:
    assert set(samplers.__all__) == {
        "RepeatSampler",
        "RepeatBatchSampler",
        "DistributedSampler",
        "DistributedBatchSampler",
        "SkipSampler",
        "SkipBatchSampler",
        "ReproducibleShuffleSampler",
        "ReproducibleShuffleBatchSampler",
    }
