"""Shared helpers for the Core API tests (tests/test_core_*.py, tests/test_preempt*.py)."""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Any, Optional


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


REPO = pathlib.Path(__file__).resolve().parent.parent


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment with the repository importable, for ``python`` children."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env
