"""Determined 0.38.1's module path ``determined.pytorch._pytorch_context``: re-exports only
(code and tests written against Determined import it).
The code lives in api/context.py."""

# ruff: noqa: F401
from determined_launch.pytorch.api.context import PyTorchTrialContext
