"""Determined 0.38.1's module path ``determined.pytorch._pytorch_trial``: re-exports only
(code and tests written against Determined import it).
The code lives in api/trial.py and loop/controller.py."""

# ruff: noqa: F401
from determined_launch.pytorch.api.trial import PyTorchTrial, _TrialState
from determined_launch.pytorch.loop.controller import _PyTorchTrialController, _ShouldExit
