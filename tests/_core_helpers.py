"""Shared helpers for the Core API tests (tests/test_core_*.py, tests/test_preempt*.py)."""

from __future__ import annotations

import pathlib
import re
import signal
import threading
import time
from typing import Any, Optional

from determined_launch.errors import EXIT_PREEMPTED
from tests.conftest import REPO, Launch, free_port_block, wait_for_file


class ThreadGroup:
    """An in-process stand-in for N DistributedContexts, one per thread.

    Only for pure-logic unit tests of code that needs collectives (the
    preemption agreement, sharded checkpoint bookkeeping): every collective
    is an exchange through a barrier. Real multi-process behaviour is tested
    with the real DistributedContext.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=20)
        self._slots: list[Any] = [None] * size
        self.collectives = 0

    def member(self, rank: int) -> ThreadRank:
        return ThreadRank(self, rank)

    def exchange(self, rank: int, stuff: Any) -> list[Any]:
        self._slots[rank] = stuff
        self._barrier.wait()
        out = list(self._slots)
        if rank == 0:
            self.collectives += 1
        self._barrier.wait()
        return out


class ThreadRank:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self._group = group
        self.rank = rank
        self.size = group.size
        self.closed = False

    def allgather(self, stuff: Any) -> list[Any]:
        return self._group.exchange(self.rank, stuff)

    def gather(self, stuff: Any) -> Optional[list[Any]]:
        out = self._group.exchange(self.rank, stuff)
        return out if self.rank == 0 else None

    def broadcast(self, stuff: Any) -> Any:
        return self._group.exchange(self.rank, stuff)[0]

    def close(self) -> None:
        self.closed = True


def run_ranks(size: int, fn: Any) -> list[Any]:
    """Run ``fn(dist)`` on ``size`` threads; returns results by rank, re-raising errors."""
    group = ThreadGroup(size)
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = fn(group.member(rank))
        except BaseException as e:  # reported to the test below
            errors.append(e)
            group._barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return results


#: Cluster info files of a 2-node x 2-slot job on loopback (the tutorial's).
TWO_NODE_INFOS = [REPO / "examples" / "core_api" / f"node{rank}.json" for rank in (0, 1)]


def start_two_nodes(argv: list[str], env: dict[str, str], launches: list[Any]) -> list[Any]:
    """Two launchers of one job, as two nodes would run them: the same
    command, their own cluster info file, a shared port block and secret."""
    port = str(free_port_block())
    nodes = []
    for info in TWO_NODE_INFOS:
        node_env = dict(
            env,
            DET_CLUSTER_INFO_FILE=str(info),
            C10D_PORT=port,
            DET_DIST_SECRET="core-test-secret-0123456789",
        )
        nodes.append(Launch(argv, node_env))
    launches.extend(nodes)
    return nodes


#: Preemption grace period the two-node tests give their launchers.
PREEMPT_GRACE = 20.0


def preempt_through_non_chief(chief: Any, other: Any, started: pathlib.Path) -> None:
    """Once ``started`` exists, signal the non-chief node's launcher; both
    launchers must exit with the preempted status within the grace period,
    say so in their summary line, and leave no process behind."""
    wait_for_file(started, 60, f"{started} (training under way)")
    t0 = time.monotonic()
    other.send_signal(signal.SIGUSR1)
    statuses = [other.wait(PREEMPT_GRACE + 15), chief.wait(PREEMPT_GRACE + 15)]
    took = time.monotonic() - t0
    logs = chief.stdout + chief.stderr + other.stdout + other.stderr
    assert statuses == [EXIT_PREEMPTED, EXIT_PREEMPTED], logs
    assert took < PREEMPT_GRACE, took
    for launch in (chief, other):
        assert "job preempted after the workers acknowledged" in launch.stderr
        assert launch.leftovers() == []


def common_stop(pattern: str, text: str, ranks: int = 4) -> int:
    """``pattern`` captures (rank, where it stopped); every rank must appear
    once, all at the same place, which is returned."""
    stops = {int(r): int(at) for r, at in re.findall(pattern, text)}
    assert sorted(stops) == list(range(ranks)), text
    assert len(set(stops.values())) == 1, stops
    return stops[0]
