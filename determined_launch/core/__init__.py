"""Worker-side library: coordination, preemption and the local Core API."""

from determined_launch.core.distributed import DistributedContext, DistributedError

__all__ = ["DistributedContext", "DistributedError"]
