"""One tracker's background thread: training appends, this thread delivers.

The training thread only appends to a bounded deque (the thread looks at it
every ``PERIOD`` seconds, or at once when a batch is waiting), so a slow or
dead tracker never slows or stops training: a full queue drops the report
and counts it, a tracker that raises is
reported once (one warning line) and dropped from then on, and ``close``
waits at most until its deadline, then gives up with one line.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Optional, Protocol

from determined_launch.common.redact import printable, redact_text

logger = logging.getLogger("determined_launch.core")

#: Reports a tracker may be behind by before new ones are dropped.
QUEUE_LIMIT = 10_000
#: Records handed to the tracker in one call.
BATCH = 500
#: Seconds between the thread's looks at the queue.
PERIOD = 0.2


class Backend(Protocol):
    """What a tracker module provides (``_mlflow.py``, ``_wandb.py``)."""

    name: str

    def start(self, resume_id: Optional[str]) -> str:
        """Open (or, with an id, continue) the run; return its id."""

    def log(self, records: list[tuple[str, int, dict[str, float]]]) -> None:
        """``(group, steps_completed, metrics)`` records, in order."""

    def tag(self, tags: Mapping[str, str]) -> None: ...

    def finish(self, state: str) -> None:
        """End the run with the trial's final state (``STATES``)."""


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics a tracker can plot: real numbers and 0-d arrays/tensors."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            continue
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if isinstance(value, (int, float)):
            out[str(key)] = float(value)
    return out


class Sink:
    """A bounded queue and the thread that empties it into one ``Backend``.

    ``on_started(run_id)`` and ``on_delivered(group, step)`` run on the
    thread (the run-id file, core/trackers/__init__.py); ``seen`` holds the
    highest step per group a previous life of this run already delivered.
    """

    def __init__(self, backend: Backend, resume_id: Optional[str],
                 seen: Mapping[str, int], state: Any, limit: int = QUEUE_LIMIT) -> None:
        self.backend = backend
        self._resume_id = resume_id
        self._seen = dict(seen)
        self._state = state
        self._limit = limit
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake = threading.Event()
        self._closing = False
        self._final: Optional[str] = None
        self._dead: Optional[str] = None
        self.dropped = 0  # counted on the training thread only
        self._lost = 0  # counted on this thread only
        self._thread = threading.Thread(target=self._run, name=f"det-tracker-{backend.name}",
                                        daemon=True)
        self._thread.start()

    # --- training thread ------------------------------------------------------

    def put(self, item: tuple[Any, ...]) -> None:
        if self._dead is not None or len(self._queue) >= self._limit:
            self.dropped += 1
            return
        self._queue.append(item)
        # No wake-up per report (a futex call, ~10 us on a busy VM): the thread
        # looks every PERIOD seconds, and is woken only when a batch is waiting.
        if len(self._queue) == BATCH:
            self._wake.set()

    def close(self, state: str, deadline: float) -> None:
        """Deliver what is queued and end the run, until ``deadline`` (monotonic)."""
        self._final = state
        self._closing = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        name = self.backend.name
        lost = len(self._queue) + self.dropped + self._lost
        if self._thread.is_alive():
            logger.warning("%s: gave up delivering after the flush deadline; %d reports not "
                           "delivered (the run's status may show it as still running)",
                           name, lost)
        elif lost:
            logger.warning("%s: %d reports not delivered", name, lost)

    # --- its thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            run_id = self.backend.start(self._resume_id)
            self._state.started(self.backend.name, run_id)
        except BaseException as e:  # a tracker never stops training: one line, then nothing
            self._die("could not start its run", e)
            return
        while True:
            self._wake.wait(PERIOD)
            self._wake.clear()
            while self._queue:
                if not self._deliver():
                    return
            if self._closing and not self._queue:
                break
        try:
            self.backend.finish(self._final or "completed")
        except BaseException as e:
            self._die("could not end its run", e)

    def _deliver(self) -> bool:
        records: list[tuple[str, int, dict[str, float]]] = []
        tags: dict[str, str] = {}
        system: list[tuple[int, float, dict[str, float]]] = []
        while self._queue and len(records) < BATCH:
            item = self._queue.popleft()
            if item[0] == "tags":
                tags.update(item[1])
                continue
            if item[0] == "system":  # (sample number, time, values): not the training steps
                system.append(item[1:])
                continue
            _, group, step, metrics = item
            if step <= self._seen.get(group, -1):
                continue  # an earlier life of this run delivered this step already
            values = numbers(metrics)
            if values:
                records.append((group, step, values))
        try:
            if records:
                self.backend.log(records)
            if tags:
                self.backend.tag(tags)
            log_system = getattr(self.backend, "log_system", None)
            if system and log_system is not None:
                log_system(system)
        except BaseException as e:
            self._die("stopped accepting reports", e, len(records) + bool(tags) + len(system))
            return False
        for group, step, _ in records:
            self._seen[group] = max(step, self._seen.get(group, -1))
        if records:
            self._state.delivered(self.backend.name, self._seen)
        return True

    def _die(self, what: str, error: BaseException, lost: int = 0) -> None:
        self._dead = f"{type(error).__name__}: {error}"
        self._lost += lost + len(self._queue)
        self._queue.clear()
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        # The tracker server's text: secrets hidden, its terminal escapes made inert.
        logger.warning("%s %s (%s: %s); training goes on without it", self.backend.name, what,
                       type(error).__name__, printable(redact_text(first[:300])))
