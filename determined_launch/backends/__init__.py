"""How to start: one module per backend, each a pure function to a ``LaunchPlan``."""

from determined_launch.backends.plan import FileToWrite, JobRuntime, LaunchPlan, ProcessSpec

__all__ = ["FileToWrite", "JobRuntime", "LaunchPlan", "ProcessSpec"]
