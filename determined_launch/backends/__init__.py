"""How to start: one module per backend, each a pure function to a ``LaunchPlan``."""

from determined_launch.backends.plan import (
    BackendArgs,
    FileToWrite,
    JobRuntime,
    LaunchPlan,
    ProcessSpec,
)

__all__ = ["BackendArgs", "FileToWrite", "JobRuntime", "LaunchPlan", "ProcessSpec"]
