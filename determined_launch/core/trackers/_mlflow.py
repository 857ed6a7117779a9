"""MLflow: experiment -> MLflow experiment, trial -> run, ``<group>/<metric>`` at
``step = steps_completed``, hyperparameters -> params, final state -> status.

Settings are MLflow's own (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``,
credentials); runs on the sink's thread only (``_sink.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import time
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from determined_launch.core.trackers import RunIdentity, flatten

#: MLflow's limits per ``log_batch`` call.
_MAX_METRICS = 1000
_MAX_PARAMS = 100
_MAX_PARAM_CHARS = 6000
#: the trial's final state -> MLflow's run status
STATUS = {"completed": "FINISHED", "stopped (ASHA)": "FINISHED", "invalid": "FINISHED",
          "preempted": "KILLED", "errored": "FAILED"}


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


@contextlib.contextmanager
def _store_lock() -> Iterator[None]:
    """Opening an SQLite store creates or migrates its tables; two processes
    doing it at once (a search's concurrent trials on MLflow's default
    ``sqlite:///mlflow.db``) leave it half-migrated ("no such index" for
    every later reader). The first open is done under a lock file beside it."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    if not uri.startswith("sqlite:///"):
        yield
        return
    path = pathlib.Path(uri[len("sqlite:///"):].split("?", 1)[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.det-lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class MlflowBackend:
    name = "mlflow"

    def __init__(self, who: RunIdentity) -> None:
        self._who = who
        self._client: Any = None
        self._run_id = ""

    def start(self, resume_id: Optional[str]) -> str:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        with _store_lock():
            self._client = client = MlflowClient()
            client.search_experiments(max_results=1)  # opens the store: creates/migrates it
        if resume_id is not None:
            client.update_run(resume_id, status="RUNNING")
            self._run_id = resume_id
            return resume_id
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or self._who.experiment or "Default"
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = client.create_experiment(name)
            except Exception:  # another trial created it first
                experiment = client.get_experiment_by_name(name)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        run = client.create_run(experiment_id, run_name=self._who.run_name,
                                tags=self._who.tags())
        self._run_id = run.info.run_id
        params = [Param(k, str(v)[:_MAX_PARAM_CHARS])
                  for k, v in flatten(self._who.hparams).items()]
        for chunk in _chunks(params, _MAX_PARAMS):
            client.log_batch(self._run_id, params=chunk)
        return self._run_id

    def log(self, records: list[tuple[str, int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"{group}/{key}", value, now, step)
                   for group, step, values in records for key, value in values.items()]
        for chunk in _chunks(metrics, _MAX_METRICS):
            self._client.log_batch(self._run_id, metrics=chunk)

    def log_system(self, samples: list[tuple[int, float, dict[str, float]]]) -> None:
        """``system/...`` metrics (trackers/_system.py) at their sample number and time."""
        from mlflow.entities import Metric

        metrics = [Metric(key, value, int(when * 1000), step)
                   for step, when, values in samples for key, value in values.items()]
        for chunk in _chunks(metrics, _MAX_METRICS):
            self._client.log_batch(self._run_id, metrics=chunk)

    def tag(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self._run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def finish(self, state: str) -> None:
        self._client.set_tag(self._run_id, "det.state", state)
        self._client.set_terminated(self._run_id, status=STATUS.get(state, "FINISHED"))


def end_if_running(run_id: str, state: str) -> bool:
    """End ``run_id`` as ``state`` if it still shows ``RUNNING``; says whether it did."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    if client.get_run(run_id).info.status != "RUNNING":
        return False
    client.set_tag(run_id, "det.state", state)
    client.set_terminated(run_id, status=STATUS.get(state, "FAILED"))
    return True
