"""det.pytorch.DataLoader, to_device, data_length (spec 2.6, 3.12) and FIX-2."""

from __future__ import annotations

import itertools
import logging
from typing import Any, Iterator, List

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)
from torch.utils.data._utils.collate import default_collate

from determined_launch import pytorch
from determined_launch.pytorch import samplers


def dataset(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def ids(batches: Any, n: int) -> List[List[int]]:
    return [b[0].tolist() for b in itertools.islice(batches, n)]


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        yield from range(3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=None), "batch_size=None with batch_sampler=None"),
        (dict(num_workers=-1), "num_workers option should be non-negative"),
        (dict(timeout=-1), "timeout option should be non-negative"),
        (dict(prefetch_factor=2), "prefetch_factor option could only be specified"),
        (dict(num_workers=1, prefetch_factor=-1), "prefetch_factor option should be non-negative"),
        (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
        (
            dict(sampler=SequentialSampler(range(10)), shuffle=True),
            "mutually exclusive with shuffle",
        ),
        (
            dict(batch_sampler=BatchSampler(range(10), 2, False), batch_size=3),
            "batch_sampler option is mutually exclusive",
        ),
        (
            dict(batch_sampler=BatchSampler(range(10), 2, False), drop_last=True),
            "batch_sampler option is mutually exclusive",
        ),
    ],
)
def test_constructor_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pytorch.DataLoader(dataset(), **kwargs)


def test_iterable_dataset_rejected_with_the_way_out() -> None:
    with pytest.raises(ValueError, match="disable_dataset_reproducibility_checks"):
        pytorch.DataLoader(Stream())


def test_defaults() -> None:
    dl = pytorch.DataLoader(dataset(), batch_size=3)
    assert isinstance(dl.sampler, SequentialSampler)
    assert isinstance(dl.batch_sampler, BatchSampler) and dl.batch_sampler.batch_size == 3
    assert dl.collate_fn is default_collate
    assert len(dl) == 4
    assert ids(dl, 10) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    shuffled = pytorch.DataLoader(dataset(), batch_size=3, shuffle=True, drop_last=True)
    assert isinstance(shuffled.sampler, RandomSampler)  # still a RandomSampler for users
    assert len(shuffled) == 3
    custom = pytorch.DataLoader(dataset(), batch_sampler=BatchSampler(range(10), 4, False))
    assert custom.batch_size is None and len(custom) == 3


def test_get_data_loader_repeat_shard_skip() -> None:
    dl = pytorch.DataLoader(dataset(), batch_size=2)
    assert ids(dl.get_data_loader(repeat=True), 7) == [
        [0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [0, 1], [2, 3],
    ]  # fmt: skip
    rank1 = dl.get_data_loader(repeat=True, num_replicas=2, rank=1)
    assert ids(rank1, 4) == [[2, 3], [6, 7], [0, 1], [4, 5]]
    assert len(dl.get_data_loader(num_replicas=2, rank=0)) == 3
    assert len(dl.get_data_loader(num_replicas=2, rank=1)) == 2
    resumed = dl.get_data_loader(repeat=True, skip=2, num_replicas=2, rank=1)
    assert ids(resumed, 2) == [[0, 1], [4, 5]]
    assert ids(dl.get_data_loader(), 100) == ids(iter(dl), 100)  # one pass, no repeat


def test_adapt_batch_sampler_chain_types() -> None:
    base = BatchSampler(range(8), 2, False)
    chained = pytorch.adapt_batch_sampler(base, repeat=True, skip=3, num_replicas=2, rank=0)
    assert isinstance(chained, samplers.SkipBatchSampler)
    assert isinstance(chained.batch_sampler, samplers.DistributedBatchSampler)
    assert isinstance(chained.batch_sampler.batch_sampler, samplers.RepeatBatchSampler)
    assert pytorch.adapt_batch_sampler(base) is base


# ---- FIX-2: deterministic shuffle ---------------------------------------------------


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_shuffle_resume_at_any_batch_is_exact(num_replicas: int) -> None:
    dl = pytorch.DataLoader(dataset(10), batch_size=3, shuffle=True)  # 4 batches, short last
    for rank in range(num_replicas):
        whole = ids(dl.get_data_loader(True, 0, num_replicas, rank, seed=11), 30)
        for n in range(0, 25):
            torch.manual_seed(1000 + n)  # the global RNG state must not matter
            resumed = dl.get_data_loader(True, n, num_replicas, rank, seed=11)
            assert ids(resumed, 5) == whole[n : n + 5], (rank, n)


def test_shuffle_epochs_differ_and_cover_the_dataset() -> None:
    dl = pytorch.DataLoader(dataset(12), batch_size=4, shuffle=True)
    stream = ids(dl.get_data_loader(repeat=True, seed=3), 9)
    epochs = [sum(stream[i : i + 3], []) for i in (0, 3, 6)]
    assert all(sorted(e) == list(range(12)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3  # each epoch its own order
    other_seed = ids(dl.get_data_loader(repeat=True, seed=4), 9)
    assert other_seed != stream


def test_shuffle_does_not_consume_or_depend_on_global_rng() -> None:
    dl = pytorch.DataLoader(dataset(10), batch_size=2, shuffle=True)
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    first = ids(dl.get_data_loader(repeat=True, seed=5), 12)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(12345)
    assert ids(dl.get_data_loader(repeat=True, seed=5), 12) == first


def test_loop_validation_stream_repeats_its_order() -> None:
    dl = pytorch.DataLoader(dataset(12), batch_size=5, shuffle=True)
    val = dl.get_data_loader(repeat=False, num_replicas=2, rank=1, seed=8)
    first = ids(val, 10)
    assert ids(val, 10) == first  # the 2nd validation (or one after a resume) sees the same
    assert ids(dl.get_data_loader(repeat=False, num_replicas=2, rank=1, seed=8), 10) == first
    train_epoch0 = ids(dl.get_data_loader(repeat=True, num_replicas=2, rank=1, seed=8), 1)
    assert train_epoch0 == first
    plain = dl.get_data_loader()  # a user's own loop without a seed: new order per pass
    passes = {tuple(sum(ids(plain, 3), [])) for _ in range(3)}
    assert len(passes) == 3


def test_user_generator_seed_drives_the_shuffle() -> None:
    def order(gen_seed: int, seed: int) -> List[List[int]]:
        g = torch.Generator()
        g.manual_seed(gen_seed)
        dl = pytorch.DataLoader(dataset(10), batch_size=5, shuffle=True, generator=g)
        return ids(dl.get_data_loader(repeat=True, seed=seed), 6)

    assert order(7, 1) == order(7, 2)  # the user's generator wins over the trial seed
    assert order(7, 1) != order(8, 1)


def test_direct_iteration_reshuffles_each_pass() -> None:
    torch.manual_seed(2)
    dl = pytorch.DataLoader(dataset(16), batch_size=16, shuffle=True)
    passes = [ids(dl, 1)[0] for _ in range(3)]
    assert all(sorted(p) == list(range(16)) for p in passes)
    assert len({tuple(p) for p in passes}) == 3


def test_fix2_resumed_training_is_bit_exact() -> None:
    """Train N, 'checkpoint' (weights + global RNG), resume with skip=N == train straight."""

    def train(steps: int, start: int = 0, state: Any = None) -> Any:
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        if state is not None:
            model.load_state_dict(state[0])
            opt.load_state_dict(state[1])
            torch.random.set_rng_state(state[2])
        xs = torch.linspace(-1, 1, 21).unsqueeze(1)
        dl = pytorch.DataLoader(TensorDataset(xs, 3 * xs + 1), batch_size=4, shuffle=True)
        it = iter(dl.get_data_loader(repeat=True, skip=start, seed=42))
        for _ in range(steps):
            x, y = next(it)
            noise = torch.randn_like(y) * 0.01  # draws from the global RNG
            loss = torch.nn.functional.mse_loss(model(x), y + noise)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return model.state_dict(), opt.state_dict(), torch.random.get_rng_state()

    straight = train(23)
    for n in (4, 6, 13):  # mid-epoch (6 batches per epoch) and on a boundary
        half = train(n)
        resumed = train(23 - n, start=n, state=half)
        for k in straight[0]:
            assert torch.equal(resumed[0][k], straight[0][k]), n


def test_workers_give_the_same_batches() -> None:
    dl = pytorch.DataLoader(dataset(12), batch_size=3, shuffle=True, num_workers=1)
    ref = pytorch.DataLoader(dataset(12), batch_size=3, shuffle=True)
    assert ids(dl.get_data_loader(repeat=True, seed=9), 6) == ids(
        ref.get_data_loader(repeat=True, seed=9), 6
    )


# ---- to_device / data_length --------------------------------------------------------


def test_to_device_containers_and_arrays() -> None:
    data = {
        "a": np.arange(3, dtype=np.float32),
        "b": [torch.ones(2), (np.array([True]), 5)],
    }
    out = pytorch.to_device(data, "cpu")
    assert isinstance(out, dict) and isinstance(out["a"], torch.Tensor)
    assert isinstance(out["b"], list) and isinstance(out["b"][1], tuple)
    assert out["b"][1][0].dtype == torch.bool
    assert out["b"][1][1] == 5


def test_to_device_warns_once_per_type(caplog: pytest.LogCaptureFixture) -> None:
    strings = np.array(["x", "y"])
    warned: set = set()
    with caplog.at_level(logging.WARNING, logger="determined_launch.pytorch"):
        out = pytorch.to_device([strings, strings, "s", "t"], "cpu", warned)
    assert out[0] is strings  # unsupported dtype kind: unchanged
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("Was not able to move data item of type 'ndarray' to device.") == 1
    assert messages.count("Was not able to move data item of type 'str' to device.") == 1
    assert warned == {np.ndarray, str}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="determined_launch.pytorch"):
        pytorch.to_device({"a": ["s", "t"], "b": ("u",)}, "cpu")  # no set given: one per call
    assert len(caplog.records) == 1


def test_to_device_calls_custom_to() -> None:
    class Box:
        def to(self, device: Any) -> str:
            return f"moved to {device}"

    assert pytorch.to_device(Box(), "cpu") == "moved to cpu"


def test_data_length() -> None:
    assert pytorch.data_length(torch.zeros(4, 2)) == 4
    assert pytorch.data_length(np.zeros(3)) == 3
    assert pytorch.data_length({"x": torch.zeros(5), "y": torch.zeros(1)}) == 5
    assert pytorch.data_length([torch.zeros(6)]) == 6
    assert pytorch.data_length((np.zeros(2),)) == 2
    for empty in ({}, [], ()):
        with pytest.raises(ValueError, match="at least one"):
            pytorch.data_length(empty)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="incorrect type"):
        pytorch.data_length("abc")  # type: ignore[arg-type]


def test_repro_warning_message() -> None:
    msg = pytorch._dataset_repro_warning("build_training_data_loader", [1])
    assert "returned an instance of list" in msg
    assert (
        "you can disable this check by calling "
        "context.experimental.disable_dataset_reproducibility_checks()" in msg
    )
    assert "context.disable_dataset_reproducibility_checks()" in pytorch._dataset_repro_warning(
        "f", 1, is_deepspeed_trial=True
    )
