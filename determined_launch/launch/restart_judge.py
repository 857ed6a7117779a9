"""``--max-restarts``' judge: this node's record of the generations so far.

The supervisor runs one generation (one start of the workers) and asks, as
it ends, whether to restart (``node.RestartJudge``). ``Restarts`` answers: it
reads where the job stands (the newest checkpoint committed in the run
directory, as ``det-launch``'s resume finds it) and asks the pure policy
(``supervisor.restarts.decide``). Every node keeps the same record, but only
the chief's decision counts while the chief lives; when it is lost, every
survivor decides alone, and the rule makes them agree: the same nodes minus
the chief, led by the lowest surviving node (docs/architecture.md).
``generations.py`` runs the generations it decides on.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Callable, Optional

from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.local_trial import METADATA_FILE, newest_committed
from determined_launch.errors import EXIT_PREEMPTED, LaunchError
from determined_launch.supervisor.events import Failure
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
    """This node's record of the generations so far: the supervisor's
    ``RestartJudge``.

    ``initial``: what the job started from (the cluster info's
    ``latest_checkpoint``); ``baseline``: the newest checkpoint in the run
    directory when the job started. A checkpoint counts as this job's
    progress only once it differs from ``baseline``, so ``--fresh`` restarts
    fresh until the job commits its own first checkpoint. ``members``: the
    current generation's nodes (original ranks); ``me``: this node's.
    """

    def __init__(self, max_restarts: int, read: Callable[[], Progress], initial: Progress,
                 members: tuple[int, ...] = (0,), me: int = 0,
                 min_nodes: Optional[int] = None) -> None:
        self.max_restarts = max_restarts
        self.min_nodes = min_nodes
        self.read = read
        self.initial = initial
        self.baseline = read()
        self.attempts: list[Attempt] = []
        self.start = initial  # the current generation's resume point
        self.members = members
        self.me = me

    def decide(self, status: int, cause: Optional[Failure],
               lost: frozenset[int] = frozenset(), joining: tuple[int, ...] = ()) -> Decision:
        """How the generation ended (``lost``: the nodes, by this generation's
        ranks, whose launchers are gone; ``joining``: the nodes it was
        preempted for, to rejoin) -> restart or not."""
        newest = self.read()
        end = newest if newest.checkpoint != self.baseline.checkpoint else self.initial
        preempted = status == EXIT_PREEMPTED and cause is None
        launcher = cause is not None and not cause.interrupt and cause.what in LAUNCHERS
        gone = {self.members[n] for n in lost if 0 <= n < len(self.members)}
        if launcher and cause is not None and cause.node in self.members:
            gone.add(cause.node)  # messages name nodes by their original rank
        self.attempts.append(Attempt(
            generation=len(self.attempts), status=status,
            cause="" if cause is None or preempted else cause.describe(),
            interrupted=cause is not None and cause.interrupt, start=self.start, end=end,
            node_lost=launcher, members=self.members, lost=tuple(sorted(gone)),
            joining=tuple(sorted(set(joining) - set(self.members)))))
        decision = decide(self.max_restarts, self.attempts, self.initial, self.min_nodes)
        return self.follow(decision)

    def used(self) -> int:
        """Restarts made so far (a rejoin is none)."""
        return sum(not a.rejoined for a in self.attempts)

    def join_at(self, generation: int, members: tuple[int, ...], start: Progress,
                used: int) -> None:
        """This node rejoins a running job at ``generation``: take its record
        (its own for the generations it ran, stand-ins for those it missed,
        ``used`` restarts in all)."""
        own = self.attempts[:generation]
        left = used - sum(not a.rejoined for a in own)  # restarts among the missed ones
        self.attempts = own + [
            Attempt(g, 1 if i < left else EXIT_PREEMPTED,
                    "a generation this node missed" if i < left else "",
                    False, start, start, node_lost=i < left,
                    joining=() if i < left else (self.me,))
            for i, g in enumerate(range(len(own), generation))]  # never "the same failure"
        self.start, self.members = start, members

    def follow(self, decision: Decision) -> Decision:
        """Take ``decision`` (this node's own, or the chief's) as this job's: a
        node that the others continue without must not start again."""
        if not decision.restart:
            return decision
        members = decision.members or self.members
        new = tuple(sorted(set(members) - set(self.members)))
        if new and self.attempts and not self.attempts[-1].joining:  # the chief's rejoin
            self.attempts[-1] = dataclasses.replace(self.attempts[-1], joining=new)
        if self.me not in members:
            who = ", ".join(str(n) for n in members)
            return Decision(False, f"not restarting: the job continues on node{_s(members)} "
                                   f"{who} without this node (node {self.me}), which it lost",
                            history=decision.history)
        self.start, self.members = decision.resume, members
        return decision


def _s(items: tuple[int, ...]) -> str:
    return "s" if len(items) > 1 else ""


def restart_judge(max_restarts: int, info: ClusterInfo, env: Mapping[str, str],
                  is_committed: Optional[Callable[[str], bool]],
                  min_nodes: Optional[int] = None) -> Optional[Restarts]:
    """The supervisor's ``restarts`` argument: ``None`` when restarts are off."""
    if not max_restarts:
        return None
    return Restarts(max_restarts, lambda: read_progress(info, env, is_committed),
                    Progress(info.latest_checkpoint), tuple(range(info.num_nodes)),
                    info.container_rank, min_nodes)


def check_min_nodes(min_nodes: Optional[int], max_restarts: int, info: ClusterInfo) -> None:
    """``--min-nodes`` makes sense only with restarts and at most the job's nodes."""
    if min_nodes is None:
        return
    if not max_restarts:
        raise LaunchError(f"--min-nodes {min_nodes} (DET_LAUNCH_MIN_NODES) needs --max-restarts "
                          f"N >= 1 (DET_LAUNCH_MAX_RESTARTS): continuing without a lost node "
                          f"uses one restart")
    if min_nodes > info.num_nodes:
        raise LaunchError(f"--min-nodes {min_nodes} (DET_LAUNCH_MIN_NODES) is more than this "
                          f"job's {info.num_nodes} node{'s' if info.num_nodes > 1 else ''}")
