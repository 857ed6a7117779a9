"""Weights & Biases: experiment -> group, trial -> run (resumed by its id),
``<group>/<metric>`` plotted against ``steps_completed``, hyperparameters ->
config, final state -> ``det.state`` in the summary and the exit code.

Settings are W&B's own (``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE``,
``WANDB_DIR``, ...); without ``WANDB_DIR`` its files go into the run
directory. Runs on the sink's thread only (``_sink.py``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from typing import Any, Optional

from determined_launch.core.trackers import RunIdentity

#: W&B's x axis for every metric: rows are logged without ``step``, so a report
#: for an earlier step (validation after training) is never dropped by W&B.
STEP = "steps_completed"
#: seconds ``wandb.init`` may wait for its server (W&B's default: 90)
INIT_TIMEOUT = 30.0


class WandbBackend:
    name = "wandb"

    def __init__(self, who: RunIdentity) -> None:
        self._who = who
        self._run: Any = None

    def start(self, resume_id: Optional[str]) -> str:
        import wandb

        run_id = resume_id or secrets.token_hex(4)  # W&B's ids: 8 lowercase letters/digits
        directory = os.environ.get("WANDB_DIR") or str(self._who.run_dir)
        os.makedirs(directory, exist_ok=True)
        self._run = run = wandb.init(
            id=run_id, resume="allow", name=self._who.run_name, group=self._who.experiment,
            config=dict(self._who.hparams), dir=directory,
            # W&B waits this long for a server that never answers, at exit too (its
            # atexit teardown): 90 s by default; ours unless WANDB_INIT_TIMEOUT is set.
            settings=None if os.environ.get("WANDB_INIT_TIMEOUT") else wandb.Settings(
                init_timeout=INIT_TIMEOUT),
        )
        run.config.update({"det": self._who.tags()}, allow_val_change=True)
        run.define_metric(STEP)
        run.define_metric("*", step_metric=STEP)
        return run_id

    def log(self, records: list[tuple[str, int, dict[str, float]]]) -> None:
        for group, step, values in records:
            row: dict[str, float] = {f"{group}/{key}": value for key, value in values.items()}
            row[STEP] = step
            self._run.log(row)

    def tag(self, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self._run.summary[key] = value

    def finish(self, state: str) -> None:
        self._run.summary["det.state"] = state
        if state == "preempted":
            self._run.mark_preempting()
        self._run.finish(exit_code=1 if state == "errored" else 0)
