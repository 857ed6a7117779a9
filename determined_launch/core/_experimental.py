"""``core_context.experimental``: Determined links a task's metrics to the
checkpoint or model version it uses (for inference). Off-cluster the link is
one line of ``<run_dir>/task_sources.jsonl``."""

from __future__ import annotations

import logging
from typing import Any

from determined_launch.core._rundir import RunDir

logger = logging.getLogger("determined_launch.core")


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


class ExperimentalCoreContext:
    def __init__(self, run_dir: RunDir) -> None:
        self._run_dir = run_dir

    def report_task_using_checkpoint(self, checkpoint: Any) -> None:
        """``checkpoint``: anything with a ``uuid`` (a storage id string works too)."""
        uuid = checkpoint if isinstance(checkpoint, str) else _field(checkpoint, "uuid")
        logger.info("this task uses checkpoint %s", uuid)
        self._run_dir.append("task_sources", {"checkpoint_uuid": uuid})

    def report_task_using_model_version(self, model_version: Any) -> None:
        ckpt = _field(model_version, "checkpoint")
        record = {"checkpoint_uuid": _field(ckpt, "uuid") if ckpt is not None else None,
                  "model_id": _field(model_version, "model_id"),
                  "model_version": _field(model_version, "model_version")}
        logger.info("this task uses model version %s", record)
        self._run_dir.append("task_sources", record)


class DummyExperimentalCoreContext(ExperimentalCoreContext):
    def __init__(self) -> None:
        pass

    def report_task_using_checkpoint(self, checkpoint: Any) -> None:
        pass

    def report_task_using_model_version(self, model_version: Any) -> None:
        pass
