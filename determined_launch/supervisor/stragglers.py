"""Which ranks are stragglers (pure): steps at least ``RATIO`` times the
median of their peers' for ``RUN`` steps in a row.

The launcher feeds one window at a time (about a second): for each rank that
made steps in it, how many and how long they took on average (busy time:
``core/_progress.py``). A rank whose average step in a window is at least
``RATIO`` times the median of the *other* ranks' (so two ranks can compare)
adds the window's steps to its slow run; any other window ends the run. A run
that reaches ``RUN`` steps makes the rank a straggler (one change); its first
window back under the ratio, a recovered one.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

RATIO = 2.0
RUN = 50


@dataclasses.dataclass(frozen=True)
class Change:
    rank: int
    slow: bool  # True: became a straggler; False: recovered
    step_time: float  # its average step in the window, seconds
    median: float  # its peers' median step, seconds


@dataclasses.dataclass
class StragglerRule:
    ratio: float = RATIO
    run: int = RUN
    slow_steps: dict[int, int] = dataclasses.field(default_factory=dict)
    flagged: set[int] = dataclasses.field(default_factory=set)

    def window(self, steps: Mapping[int, tuple[int, float]]) -> list[Change]:
        """``steps``: rank -> (steps in this window, their average seconds)."""
        times = {r: t for r, (n, t) in steps.items() if n > 0}
        out: list[Change] = []
        for rank, (n, t) in sorted(steps.items()):
            peers = [p for r, p in times.items() if r != rank]
            if n <= 0 or not peers:
                continue  # no steps (or no one to compare with): nothing learned
            median = statistics.median(peers)
            if median > 0 and t >= self.ratio * median:
                self.slow_steps[rank] = self.slow_steps.get(rank, 0) + n
                if self.slow_steps[rank] >= self.run and rank not in self.flagged:
                    self.flagged.add(rank)
                    out.append(Change(rank, True, t, median))
            else:
                self.slow_steps[rank] = 0
                if rank in self.flagged:
                    self.flagged.discard(rank)
                    out.append(Change(rank, False, t, median))
        return out


def summary(records: Iterable[Any], keep: int = 50) -> dict[str, Any]:
    """The run directory's ``stragglers.jsonl`` (``watchdog.record_straggler``'s
    lines, parsed) as ``{now: ranks slow at their last record, events: the
    newest ``keep`` changes}``, for det-launch ui and the experiment table; a
    line not of that shape is left out."""
    events: list[dict[str, Any]] = []
    slow: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        if not isinstance(r, dict) or not isinstance(r.get("rank"), int) or isinstance(
                r.get("rank"), bool) or not isinstance(r.get("straggler"), bool):
            continue
        event = {k: r.get(k) for k in ("time", "rank", "node", "host", "straggler",
                                        "step_time", "median")}
        events.append(event)
        key = (str(event["node"]), int(r["rank"]))
        if event["straggler"]:
            slow[key] = event
        else:
            slow.pop(key, None)
    return {"now": [slow[k] for k in sorted(slow)], "events": events[-keep:]}
