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
from collections.abc import Mapping

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
