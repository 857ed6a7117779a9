"""Stragglers: the pure rule (supervisor/stragglers.py), and the watchdog over
real progress files of two ranks' beacons (core/_progress.py), with the line
the launcher prints and the run directory's record."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from determined_launch.core import _progress
from determined_launch.supervisor import watchdog as wd
from determined_launch.supervisor.stragglers import RUN, Change, StragglerRule
from tests.conftest import WORKERS, Launch, base_env


def feed(rule: StragglerRule, windows: int, slow: float, steps: int = 10,
         ranks: int = 4) -> list[Change]:
    """``windows`` windows where rank 1's steps take ``slow`` x the others' 0.01 s."""
    out: list[Change] = []
    for _ in range(windows):
        out += rule.window({r: (steps, 0.01 * (slow if r == 1 else 1.0)) for r in range(ranks)})
    return out


def test_twice_the_median_for_50_steps_in_a_row_is_one_warning() -> None:
    rule = StragglerRule()
    assert feed(rule, 4, slow=2.0) == []  # 40 slow steps: not yet
    assert feed(rule, 1, slow=2.0) == [Change(1, True, 0.02, 0.01)]  # the 50th
    assert feed(rule, 20, slow=3.0) == []  # said once
    assert feed(rule, 1, slow=1.5) == [Change(1, False, 0.015, 0.01)]  # and once recovered
    assert feed(rule, 3, slow=1.0) == []


def test_a_run_is_in_a_row_and_just_under_twice_is_not_slow() -> None:
    rule = StragglerRule()
    assert feed(rule, 4, slow=2.5) + feed(rule, 1, slow=1.0) + feed(rule, 4, slow=2.5) == []
    assert feed(rule, 10, slow=1.99) == []
    assert feed(rule, 1, slow=2.5, steps=RUN) == [Change(1, True, 0.025, 0.01)]


def test_the_median_is_the_peers_so_two_ranks_compare() -> None:
    rule = StragglerRule()
    out = feed(rule, 5, slow=3.0, ranks=2)
    assert out == [Change(1, True, 0.03, 0.01)]  # median of [0.01, 0.03] would hide it
    assert StragglerRule().window({0: (100, 1.0)}) == []  # alone: no one to compare with


def test_a_window_without_steps_teaches_nothing() -> None:
    rule = StragglerRule()
    feed(rule, 4, slow=2.0)
    rule.window({0: (10, 0.01), 1: (0, 0.0), 2: (10, 0.01)})  # rank 1 made no step
    assert feed(rule, 1, slow=2.0) == [Change(1, True, 0.02, 0.01)]  # the run goes on


def test_the_watchdog_reads_two_real_beacons_and_says_who_straggles(tmp_path: Path) -> None:
    fast, slow = _progress.Beacon(str(tmp_path), 0), _progress.Beacon(str(tmp_path), 1)
    dog = wd.Watchdog(str(tmp_path), timeout=None)  # stragglers only
    changes: list[Change] = []
    try:
        for second in range(4):
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                for _ in range(3):
                    fast.beat(1)
                    time.sleep(0.002)
                slow.beat(1)  # one step in the time of three of rank 0's
            for b in (fast, slow):
                b.write()
            hang, new = dog.poll(float(second), time.time(), done=())
            assert hang is None
            changes += new
    finally:
        fast.close()
        slow.close()
    assert [(c.rank, c.slow) for c in changes] == [(1, True)], changes
    c = changes[0]
    line = wd.straggler_line(c, 0, "h0")
    assert line.startswith("rank 1 on node 0 (h0) is a straggler: its steps take ")
    assert f"x its peers' median {c.median:.3g} s, for 50 steps in a row" in line
    assert c.step_time >= 2 * c.median
    wd.record_straggler(str(tmp_path), c, 0, "h0", 1.5)
    wd.record_straggler(str(tmp_path), Change(1, False, 0.01, 0.01), 0, "h0", 2.5)
    records = [json.loads(s) for s in (tmp_path / wd.STRAGGLERS_STREAM).read_text().splitlines()]
    assert [(r["rank"], r["node"], r["host"], r["straggler"], r["time"]) for r in records] == [
        (1, 0, "h0", True, 1.5), (1, 0, "h0", False, 2.5)]
    wd.record_straggler(str(tmp_path / "missing"), c, 0, "h0", 1.0)  # lost, never raised


@pytest.mark.slow
def test_a_slow_rank_is_named_once_and_recorded(tmp_path: Path, launches: list[Launch]) -> None:
    # 3 ranks without torch; rank 1 is 4x slower for 400 of 2000 steps (~3 s), then recovers
    run_dir = tmp_path / "run"
    launch = Launch([sys.executable, str(WORKERS / "straggler_worker.py"), "launcher"],
                    base_env(DET_RUN_DIR=str(run_dir), DET_LAUNCH_SLOTS="3"))
    launches.append(launch)
    assert launch.wait(90) == 0, launch.stderr
    lines = [s for s in launch.stderr.splitlines() if "straggler" in s]
    assert len(lines) == 2, launch.stderr
    assert re.fullmatch(r"det-launch: rank 1 on node 0 \(\S+\) is a straggler: its steps take "
                        r"\S+ s, \S+x its peers' median \S+ s, for 50 steps in a row", lines[0])
    assert re.match(r"det-launch: rank 1 on node 0 \(\S+\) is no longer a straggler", lines[1])
    records = [json.loads(s) for s in (run_dir / wd.STRAGGLERS_STREAM).read_text().splitlines()]
    assert [(r["rank"], r["node"], r["straggler"]) for r in records] == [
        (1, 0, True), (1, 0, False)]
    assert launch.leftovers() == []
