"""Worker-side library: coordination, preemption and the local Core API."""

from determined_launch.core._context import Context, init
from determined_launch.core._dummy import DummyTrainContext, _dummy_init  # noqa: F401
from determined_launch.core.checkpoint import CheckpointContext
from determined_launch.core.distributed import DistributedContext, DistributedError
from determined_launch.core.preempt import PreemptContext, PreemptMode
from determined_launch.core.searcher import SearcherContext, SearcherMode, SearcherOperation, Unit
from determined_launch.core.train import TrainContext

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DistributedError",
    "DummyTrainContext",
    "PreemptContext",
    "PreemptMode",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TrainContext",
    "Unit",
    "init",
]
