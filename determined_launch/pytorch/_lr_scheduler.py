"""Determined 0.38.1's module path ``determined.pytorch._lr_scheduler``: re-exports only
(code and tests written against Determined import it).
The code lives in optim/lr_scheduler.py."""

# ruff: noqa: F401
from determined_launch.pytorch.optim.lr_scheduler import LRScheduler
