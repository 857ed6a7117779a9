"""Worker-side library: coordination, preemption and the local Core API."""

from determined_launch.core._context import Context, init
from determined_launch.core._dummy import (  # noqa: F401
    DummyCheckpointContext,
    DummyDistributedContext,
    DummyPreemptContext,
    DummySearcherContext,
    DummySearcherOperation,
    DummyTrainContext,
    SearcherContextMissing,
    _dummy_init,
)
from determined_launch.core._experimental import (
    DummyExperimentalCoreContext,
    ExperimentalCoreContext,
)
from determined_launch.core._profiler import DummyProfilerContext, ProfilerContext
from determined_launch.core._train_local import EarlyExitReason
from determined_launch.core.checkpoint import CheckpointContext, DownloadMode
from determined_launch.core.distributed import DistributedContext, DistributedError
from determined_launch.core.preempt import PreemptContext, PreemptMode
from determined_launch.core.searcher import SearcherContext, SearcherMode, SearcherOperation, Unit
from determined_launch.core.tensorboard import TensorboardMode
from determined_launch.core.train import TrainContext

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DistributedError",
    "DownloadMode",
    "DummyCheckpointContext",
    "DummyDistributedContext",
    "DummyExperimentalCoreContext",
    "DummyPreemptContext",
    "DummyProfilerContext",
    "DummySearcherContext",
    "DummySearcherOperation",
    "DummyTrainContext",
    "EarlyExitReason",
    "ExperimentalCoreContext",
    "PreemptContext",
    "PreemptMode",
    "ProfilerContext",
    "SearcherContext",
    "SearcherContextMissing",
    "SearcherMode",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "Unit",
    "init",
]
