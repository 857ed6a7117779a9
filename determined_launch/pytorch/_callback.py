"""Determined 0.38.1's module path ``determined.pytorch._callback``: re-exports only
(code and tests written against Determined import it).
The code lives in api/callback.py."""

# ruff: noqa: F401
from determined_launch.pytorch.api.callback import PyTorchCallback
