"""Determined 0.38.1's module path ``determined.pytorch._load``: re-exports only
(code and tests written against Determined import it).
The code lives in checkpoints/load.py."""

# ruff: noqa: F401
from determined_launch.pytorch.checkpoints.load import (
    CheckpointLoadContext,
    load_trial_from_checkpoint_path,
)
