"""``--max-restarts``: the launcher's memory across generations.

The supervisor runs one generation (one start of the workers) and asks, as
it ends, whether to restart (``node.RestartJudge``). ``Restarts`` answers on
the chief (or a single node): it reads where the job stands (the newest
checkpoint committed in the run directory, as ``det-launch``'s resume finds
it) and asks the pure policy (``supervisor.restarts.decide``). Non-chief
nodes never call it: they follow the chief's decision.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from collections.abc import Mapping
from typing import Callable, Optional

from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.local_trial import METADATA_FILE, newest_committed
from determined_launch.errors import EXIT_PREEMPTED
from determined_launch.supervisor.events import Failure
from determined_launch.supervisor.node import RestartJudge
from determined_launch.supervisor.restarts import Attempt, Decision, Progress, decide

#: How the verdict names a launcher (not a worker) that failed: it was lost or never connected.
LAUNCHERS = ("the launcher", "the chief's launcher")


def read_progress(info: ClusterInfo, env: Mapping[str, str],
                  is_committed: Optional[Callable[[str], bool]]) -> Progress:
    """The newest committed checkpoint of the run directory and its
    ``steps_completed`` (from its metadata, on a checkpoint directory)."""
    storage_id, storage = newest_committed(info, env, is_committed)
    if storage_id is None:
        return Progress()
    steps = None
    if storage is not None:
        try:
            meta = json.loads(pathlib.Path(storage, storage_id, METADATA_FILE).read_text("utf-8"))
            raw = meta.get("steps_completed") if isinstance(meta, dict) else None
            steps = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
        except (OSError, ValueError):
            pass
    return Progress(storage_id, steps)


class Restarts:
    """The chief's record of the generations so far; ``decide`` is the
    supervisor's ``RestartJudge``.

    ``initial``: what the job started from (the cluster info's
    ``latest_checkpoint``); ``baseline``: the newest checkpoint in the run
    directory when the job started. A checkpoint counts as this job's
    progress only once it differs from ``baseline``, so ``--fresh`` restarts
    fresh until the job commits its own first checkpoint.
    """

    def __init__(self, max_restarts: int, read: Callable[[], Progress], initial: Progress) -> None:
        self.max_restarts = max_restarts
        self.read = read
        self.initial = initial
        self.baseline = read()
        self.attempts: list[Attempt] = []
        self.start = initial  # the current generation's resume point

    def decide(self, status: int, cause: Optional[Failure]) -> Decision:
        newest = self.read()
        end = newest if newest.checkpoint != self.baseline.checkpoint else self.initial
        preempted = status == EXIT_PREEMPTED and cause is None
        self.attempts.append(Attempt(
            generation=len(self.attempts), status=status,
            cause="" if cause is None or preempted else cause.describe(),
            interrupted=cause is not None and cause.interrupt, start=self.start, end=end,
            node_lost=cause is not None and not cause.interrupt and cause.what in LAUNCHERS))
        decision = decide(self.max_restarts, self.attempts, self.initial)
        if decision.restart:
            self.start = decision.resume
        return decision


def restart_judge(max_restarts: int, info: ClusterInfo, env: Mapping[str, str],
                  is_committed: Optional[Callable[[str], bool]]) -> Optional[RestartJudge]:
    """The supervisor's ``restarts`` argument: ``None`` when restarts are off;
    the chief's (or single node's) ``Restarts``; on other nodes a judge that
    is never asked (they follow the chief's decision)."""
    if not max_restarts:
        return None
    if info.single_node or info.is_chief:
        return Restarts(max_restarts, lambda: read_progress(info, env, is_committed),
                        Progress(info.latest_checkpoint)).decide
    return lambda _status, _cause: Decision(False)


def generation_info(info: ClusterInfo, decision: Decision) -> ClusterInfo:
    """The next generation's cluster info: resuming from the decision's checkpoint."""
    return dataclasses.replace(info, latest_checkpoint=decision.resume.checkpoint)


def generation_secret(secret: Optional[str], generation: int) -> Optional[str]:
    """Generation 0 keeps the job's secret; each later one derives its own, so
    the control channel and DistributedContext of an old generation cannot
    authenticate to a new one (every node derives the same key)."""
    if secret is None or generation == 0:
        return secret
    return hashlib.sha256(f"{secret}|det-launch generation {generation}".encode()).hexdigest()
