"""Worker-side library: coordination, preemption and the local Core API."""

from determined_launch.core._context import Context, init
from determined_launch.core._dummy import DummyTrainContext, _dummy_init  # noqa: F401
from determined_launch.core.checkpoint import CheckpointContext, DownloadMode
from determined_launch.core.distributed import DistributedContext, DistributedError
from determined_launch.core.preempt import PreemptContext, PreemptMode
from determined_launch.core.searcher import SearcherContext, SearcherOperation
from determined_launch.core.tensorboard import TensorboardMode
from determined_launch.core.train import TrainContext

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DistributedError",
    "DownloadMode",
    "DummyTrainContext",
    "PreemptContext",
    "PreemptMode",
    "SearcherContext",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "init",
]
