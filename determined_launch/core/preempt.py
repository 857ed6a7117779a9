"""Synchronized preemption on the worker side.

Where a preemption request comes from, with no master involved:

* **the launcher**: a preemption signal (TERM or USR1 by default) to *any*
  node's launcher, or the operator's ``DET_PREEMPT_FILE`` appearing, makes
  every node's launcher create the file named by ``DET_PREEMPT_SIGNAL_FILE``
  in its workers' environment within a second;
* **the operator's file** ``DET_PREEMPT_FILE`` read directly, which also
  works for a script started without a launcher;
* **Python**: ``PreemptContext.request_preemption()`` (safe to call from a
  signal handler or another thread).

Each check of those sources is an ``os.stat`` per file. How the ranks turn
what each of them sees into one decision is set by ``PreemptMode``.

Why the decision must be synchronized: a rank that leaves the training loop
while the others enter the next all-reduce leaves them waiting forever (the
deadlock seen in Lightning and submitit). In the default mode every rank
gets the same answer on the same call, so all ranks stop after the same step.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Optional

from determined_launch import envvars
from determined_launch.core import _progress
from determined_launch.core._dist import Collectives

logger = logging.getLogger("determined_launch.core")

#: Target seconds between the agreements made by ``should_preempt(block=False)``.
DEFAULT_SYNC_PERIOD = 0.1
#: Upper bound on calls between two agreements, whatever the step time.
DEFAULT_MAX_SYNC_INTERVAL = 1000
#: Seconds between agreements that pool every rank's view (see ``_agree``).
POOL_PERIOD = 1.0


class PreemptMode(enum.Enum):
    """How ``should_preempt()`` is called and how its answer is agreed.

    ``WorkersAskChief`` (the default): every rank calls ``should_preempt()``
    in step and all get the same answer on the same call. The chief reads
    its node's sources and broadcasts its decision (a launcher signal on any
    node reaches the chief's node within a second). About once a second an
    agreement also pools what the other ranks see, so a
    ``request_preemption()`` on a non-chief rank counts too, a little later.

    ``ChiefOnly``: only the chief may call ``should_preempt()``; it reads its
    own node's sources. Telling the other ranks is up to you. A non-chief
    call raises ``RuntimeError``.

    ``WorkersAskMaster``: each rank reads its own node's sources, with no
    communication. Ranks see a request at about the same time (the launcher
    propagates it to every node within a second) but not on the same call;
    tolerating that is up to you. The name is Determined's; there is no
    master here.
    """

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """Answers "should this job stop now so it can be resumed later?".

    ``should_preempt(block=True)`` (the default, as in Determined) makes one
    agreement per call in ``WorkersAskChief`` mode: a broadcast from the
    chief of a flag and two integers (an allgather about once a second).

    ``should_preempt(block=False)`` is cheap enough to call every batch. The
    ranks still agree, but only at *sync points*: call indices that every
    rank computes identically. Between sync points a call is a counter
    increment and a comparison (well under a microsecond) and returns the
    last agreed answer. At a sync point the ranks make the same agreement as
    a blocking call, which also fixes the next sync point, chosen from the
    measured time per call so that agreements are about ``sync_period``
    seconds apart (never
    more than ``max_sync_interval`` calls, growing at most twofold per
    agreement, so a sudden slowdown costs at most one long interval).

    The guarantee (``WorkersAskChief``, both ``block`` values): if every rank
    makes the same sequence of ``should_preempt`` calls, every rank returns
    ``True`` for the first time on the same call index, and keeps returning
    ``True`` afterwards. A request that reaches the chief is acted on at the
    next sync point: with ``block=False`` within about ``sync_period``
    seconds (or one step, if steps are longer) of the launcher's signal file
    appearing. A request only a non-chief rank sees waits for the next
    pooled agreement (about ``POOL_PERIOD`` seconds).
    """

    def __init__(
        self,
        dist: Collectives,
        preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
        *,
        signal_file: Optional[str] = None,
        preempt_file: Optional[str] = None,
        ack_file: Optional[str] = None,
        sync_period: float = DEFAULT_SYNC_PERIOD,
        max_sync_interval: int = DEFAULT_MAX_SYNC_INTERVAL,
    ) -> None:
        if sync_period <= 0:
            raise ValueError(f"sync_period must be positive, got {sync_period}")
        if max_sync_interval < 1:
            raise ValueError(f"max_sync_interval must be >= 1, got {max_sync_interval}")
        self._dist = dist
        self._mode = PreemptMode(preempt_mode)
        self._watched = tuple(p for p in (signal_file, preempt_file) if p)
        self._ack_file = ack_file
        self._sync_period = sync_period
        self._max_interval = max_sync_interval

        self._requested: Optional[str] = None  # reason given to request_preemption()
        self._decided = False  # sticky: once True, every later call returns True
        self._acked = False
        self._calls = 0  # index of the latest should_preempt() call (1-based)
        self._beaten = 0  # the call that last told the progress beacon (_progress)
        self._next_sync = 1  # block=False calls before this index skip the check
        self._interval = 1  # calls between the last two sync points
        self._last_sync_call = 0
        self._last_sync_end: Optional[float] = None
        self._pool_next = True  # the first agreement pools every rank's view
        self._last_pool = 0.0

    @classmethod
    def from_env(
        cls,
        dist: Collectives,
        preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
        env: Optional[Mapping[str, str]] = None,
        **kwargs: Any,
    ) -> PreemptContext:
        """Watch the files our launchers name in the worker environment."""
        env = os.environ if env is None else env
        _announce_listening(env.get(envvars.PREEMPT_LISTEN_FILE))
        return cls(
            dist,
            preempt_mode,
            signal_file=env.get(envvars.PREEMPT_SIGNAL_FILE) or None,
            preempt_file=env.get(envvars.PREEMPT_FILE) or None,
            ack_file=env.get(envvars.PREEMPT_ACK_FILE) or None,
            **kwargs,
        )

    # Determined's PreemptContext is started and closed with the Core
    # context; nothing here runs in the background, so both are trivial.
    def start(self) -> PreemptContext:
        return self

    def close(self) -> None:
        pass

    def __enter__(self) -> PreemptContext:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.close()

    @property
    def mode(self) -> PreemptMode:
        return self._mode

    @property
    def calls(self) -> int:
        """How many times ``should_preempt`` has been called on this rank."""
        return self._calls

    def request_preemption(self, reason: str = "requested from Python") -> None:
        """Ask the job to stop as if the launcher had been signalled.

        Only this process learns of it directly. In ``WorkersAskChief`` mode
        a request on the chief is acted on at the next agreement, one on
        another rank at the next pooled agreement. A single attribute write,
        so it is safe in signal handlers and other threads.
        """
        self._requested = reason

    def should_preempt(self, auto_ack: bool = True, block: bool = True) -> bool:
        """``True`` when the job should save its progress and exit.

        ``auto_ack``: the first time this returns ``True``, tell the launcher
        that the workers are complying (``acknowledge_preemption_signal``), so
        that it reports "preempted, resumable" rather than "succeeded" when
        the workers exit 0. Pass ``False`` if you may ignore the request.

        ``block``: see the class docstring. ``False`` checks only at agreed
        sync points and is cheap enough to call every batch.
        """
        self._calls = n = self._calls + 1
        if not block and n < self._next_sync:
            return False
        # The steps since the last check: the hang watchdog's and straggler check's signal,
        # given here only, so a quiet poll costs nothing more.
        _progress.beat(n - self._beaten)
        self._beaten = n
        t0 = time.monotonic()
        try:
            return self._check(n, auto_ack)
        finally:
            _progress.waited(time.monotonic() - t0)  # waiting for peers is not this rank's step

    def quiet_polls(self) -> int:
        """How many of the next ``should_preempt(block=False)`` calls would return
        False without checking anything (0: the next one may check). A loop may
        count them itself and report them with ``skip_polls`` (the Trainer does:
        no call per batch between sync points)."""
        return max(0, self._next_sync - self._calls - 1)

    def skip_polls(self, n: int) -> None:
        """Count ``n`` ``should_preempt(block=False)`` calls made without calling
        (at most ``quiet_polls()``), so that the sync points stay where every
        rank expects them."""
        if not 0 <= n <= self.quiet_polls():
            raise ValueError(f"skip_polls({n}): only {self.quiet_polls()} quiet polls are due")
        self._calls += n

    def _check(self, n: int, auto_ack: bool) -> bool:
        if self._decided:
            out = True
        elif self._mode is PreemptMode.WorkersAskChief:
            out = self._agree(n)
        else:
            if self._mode is PreemptMode.ChiefOnly and self._dist.rank != 0:
                raise RuntimeError(
                    "PreemptContext was configured with preempt_mode=ChiefOnly but "
                    f"should_preempt() was called on a non-chief worker (rank={self._dist.rank}); "
                    "call it only on rank 0, or use PreemptMode.WorkersAskChief"
                )
            out = self._local_reason() is not None
            self._schedule(n, [self._propose(n, time.monotonic())])
        if out and not self._decided:
            self._decided = True
            self._next_sync = 0  # every later call takes the (trivial) slow path
            logger.info("preemption requested; should_preempt() returns True from call %d", n)
        if out and auto_ack and not self._acked:
            self.acknowledge_preemption_signal()
        return out

    def _agree(self, n: int) -> bool:
        """One agreement on [preempt?, calls until the next sync point].

        Usually the chief decides from what it sees and broadcasts: one
        message, and the chief does not wait for the others (the same cost
        as Determined's check). About once every ``POOL_PERIOD`` seconds (the
        chief says when, in its broadcast, so every rank knows) the agreement
        is an allgather instead, so that what only a non-chief rank sees (its
        own ``request_preemption()``, a node whose launcher lost contact with
        the others) still counts: the decision is then the OR over all ranks,
        and the interval the smallest proposed.
        """
        now = time.monotonic()
        vote: Optional[list[Any]] = None
        if self._dist.rank == 0 or self._pool_next:
            vote = [self._local_reason() is not None, self._propose(n, now)]
        votes: list[Any]
        if self._dist.size == 1:
            votes = [vote]
        elif self._pool_next:
            votes = self._dist.allgather(vote)
            self._pool_next, self._last_pool = False, now
        else:
            if vote is not None:  # the chief
                vote.append(now - self._last_pool >= POOL_PERIOD)
            votes = [self._dist.broadcast(vote)]
            self._pool_next = bool(votes[0][2])
        self._schedule(n, [int(v[1]) for v in votes])
        return any(bool(v[0]) for v in votes)

    def _propose(self, n: int, now: float) -> int:
        """Calls until the next sync point, from this rank's recent step time.

        The interval at most doubles per agreement: a burst of fast calls
        (warm-up, an empty batch) cannot push the next check far out.
        """
        if self._last_sync_end is None:
            return 1
        per_call = (now - self._last_sync_end) / max(1, n - self._last_sync_call)
        want = self._max_interval if per_call <= 0 else int(self._sync_period / per_call)
        return max(1, min(want, 2 * self._interval, self._max_interval))

    def _schedule(self, n: int, proposals: list[int]) -> None:
        # Every rank sees the same proposals, so every rank picks the same index.
        self._interval = min(proposals)
        self._next_sync = n + self._interval
        self._last_sync_call = n
        self._last_sync_end = time.monotonic()

    def _local_reason(self) -> Optional[str]:
        """What this process sees: a Python request, or a file that exists."""
        if self._requested is not None:
            return self._requested
        for path in self._watched:
            if os.path.exists(path):
                return f"{path} exists"
        return None

    def acknowledge_preemption_signal(self) -> None:
        """Tell this node's launcher the workers are stopping to be resumed.

        Creates the file named by ``DET_PREEMPT_ACK_FILE``. Without it, a
        launcher whose workers all exit 0 reports plain success; with it, it
        exits with ``EXIT_PREEMPTED`` (75), meaning "run the same command
        again to resume". Every rank may call it; it is idempotent. Outside
        a launcher there is no one to tell, and it only logs.
        """
        self._acked = True
        if not self._ack_file:
            logger.info("preemption acknowledged (no launcher to tell: DET_PREEMPT_ACK_FILE unset)")
            return
        with open(self._ack_file, "a", encoding="utf-8") as f:
            f.write(f"rank {self._dist.rank}\n")


def _announce_listening(path: Optional[str]) -> None:
    """Tell this node's launcher that a worker watches for preemption, so a
    preemption signal gives the workers their grace period instead of
    stopping them at once."""
    if not path:
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as e:
        logger.warning("cannot tell the launcher this worker watches for preemption: %s", e)
