"""Determined 0.38.1's module path ``determined.pytorch._trainer_utils``: re-exports only
(code and tests written against Determined import it).
The code lives in _units.py, api/trial.py and loop/controller.py."""

# ruff: noqa: F401
from determined_launch.pytorch._units import (
    Batch,
    Epoch,
    TrainUnit,
    _TrainBoundary,
    _TrainBoundaryType,
)
from determined_launch.pytorch.api.trial import _TrialState
from determined_launch.pytorch.loop.controller import _ShouldExit
