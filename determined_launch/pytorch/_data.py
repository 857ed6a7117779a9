"""Determined 0.38.1's module path ``determined.pytorch._data``: re-exports only
(code and tests written against Determined import it).
The code lives in data/loader.py."""

# ruff: noqa: F401
from determined_launch.pytorch.data.loader import (
    DataLoader,
    TorchData,
    _Data,
    _dataset_repro_warning,
    adapt_batch_sampler,
    data_length,
    to_device,
)
