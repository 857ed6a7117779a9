"""Determined 0.38.1's module path ``determined.pytorch._trainer``: re-exports only
(code and tests written against Determined import it).
The code lives in api/trainer.py."""

# ruff: noqa: F401
from determined_launch.pytorch.api.trainer import Trainer, init
