"""Ctrl-C and TERM end every launcher with the documented status, within
``--kill-after`` (plus a little), and leave no process behind."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import WORKERS, Launch, base_env, launcher_cmd, wait_for_file
from tests.test_launch_e2e import two_node_launches

pytestmark = pytest.mark.slow
STUBBORN = (sys.executable, str(WORKERS / "stubborn.py"))
KILL_AFTER = 3.0
#: The two-node tests check that a stop reaches both nodes, not how long kill_after is
#: (the single-node ones above check that): a shorter one, ~2 s less per test.
TWO_NODE_KILL_AFTER = 1.0
#: Slack over kill_after for a loaded 2-core machine; not a performance target
#: (that is benchmarks/bench_stop.py).
SLACK = 5.0


def start(tmp_path: Path, launches: list[Launch], **extra: str) -> tuple[Launch, Path]:
    ready = tmp_path / "ready"
    ready.mkdir()
    env = base_env(**{"DET_LAUNCH_SLOTS": "2", "READY_DIR": str(ready),
                      "DET_KILL_AFTER": str(KILL_AFTER), **extra})
    launch = Launch(launcher_cmd(*STUBBORN), env)
    launches.append(launch)
    wait_for_file(ready / "rank-1", 120, "both ranks running")
    return launch, ready


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_prompt_workers(
    tmp_path: Path, launches: list[Launch], sig: int, status: int
) -> None:
    launch, _ = start(tmp_path, launches)
    sent = time.monotonic()
    launch.send_signal(sig)
    assert launch.wait(60) == status, launch.stderr
    assert time.monotonic() - sent < KILL_AFTER + SLACK
    assert launch.stderr.rstrip().splitlines()[-1].startswith("det-launch: job stopped:")
    assert launch.leftovers(settle=0.0) == []  # gone before the launcher exited


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_with_workers_that_ignore_it_ends_after_kill_after(
    tmp_path: Path, launches: list[Launch], sig: int, status: int
) -> None:
    launch, _ = start(tmp_path, launches, IGNORE_TERM="1")
    sent = time.monotonic()
    launch.send_signal(sig)
    assert launch.wait(60) == status, launch.stderr
    elapsed = time.monotonic() - sent
    assert KILL_AFTER <= elapsed < KILL_AFTER + SLACK, elapsed
    assert launch.leftovers(settle=0.0) == []


def test_second_sigint_kills_at_once(tmp_path: Path, launches: list[Launch]) -> None:
    launch, _ = start(tmp_path, launches, IGNORE_TERM="1", DET_KILL_AFTER="60")
    launch.send_signal(signal.SIGINT)
    time.sleep(0.5)
    sent = time.monotonic()
    launch.send_signal(signal.SIGINT)
    assert launch.wait(30) == 130, launch.stderr
    assert time.monotonic() - sent < SLACK  # not the 60 s kill_after
    assert launch.leftovers(settle=0.0) == []


@pytest.mark.parametrize(
    "sig,target,ignore",
    [(signal.SIGINT, t, i) for t in (0, 1) for i in (False, True)]
    + [(signal.SIGTERM, t, True) for t in (0, 1)],
)
def test_signal_to_either_launcher_of_two_nodes_stops_both(
    tmp_path: Path, launches: list[Launch], sig: int, target: int, ignore: bool
) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    extra = {"READY_DIR": str(ready), "DET_KILL_AFTER": str(TWO_NODE_KILL_AFTER)}
    if ignore:
        extra["IGNORE_TERM"] = "1"
    chief, node1 = two_node_launches(tmp_path, worker=STUBBORN, **extra)
    launches += [chief, node1]
    for rank in range(4):
        wait_for_file(ready / f"rank-{rank}", 120, f"rank {rank} running")
    sent = time.monotonic()
    (chief, node1)[target].send_signal(sig)
    name = signal.Signals(sig).name
    for launch in (chief, node1):
        assert launch.wait(60) == 128 + sig, launch.stderr
        summary = launch.stderr.rstrip().splitlines()[-1]
        assert f"det-launch: job stopped: the launcher on node {target} (127.0.0.1)" in summary
        assert name in summary, summary
        assert launch.leftovers(settle=0.0) == []
    assert time.monotonic() - sent < TWO_NODE_KILL_AFTER + SLACK


# 30 torchrun start-ups: about 3 s each on an idle 2-core machine, twice that
# under load; the suite's 180 s default is for one job, not thirty. The defect
# showed once in about nine runs: 30 runs miss it with probability (8/9)^30, ~3 %
# (50 runs cost 88 s of the suite's ~20 minutes for 0.3 %).
@pytest.mark.timeout(600)
def test_missing_script_names_a_genuine_failure_never_our_term_30_times(
    tmp_path: Path, launches: list[Launch],
) -> None:
    """Both ranks fail at once; torchrun would stop the survivor. The verdict
    is status 2 every time, never the TERM of a teardown (issue 11's defect:
    once in about nine runs it said "killed by SIGTERM (status 143)")."""
    # Two at a time: half the wall time on 2 cores, and the extra load only makes the
    # race this guards against likelier.
    for first in range(0, 30, 2):
        # each its own run directory: one live job per run directory (run_lease.py)
        pair = [Launch(launcher_cmd(sys.executable, "/nonexistent/script.py"),
                       base_env(DET_LAUNCH_SLOTS="2", DET_RUN_DIR=str(tmp_path / f"run{i}")))
                for i in range(first, first + 2)]
        launches.extend(pair)
        for attempt, launch in enumerate(pair, start=first):
            status = launch.wait(60)
            summary = launch.stderr.rstrip().splitlines()[-1]
            assert status == 2, (attempt, launch.stderr)
            assert "exited with status 2 first" in summary, (attempt, summary)
            assert "SIGTERM" not in summary, (attempt, summary)


def test_the_rank_that_died_first_is_named_though_its_peer_exited_first(
    launches: list[Launch]
) -> None:
    """Rank 1 raises, then its teardown lasts 1.5 s; rank 0 sees it vanish and exits at
    once. By exit times rank 0 was first (the old summary named it, exit status 1)."""
    env = base_env(DET_LAUNCH_SLOTS="2", DET_KILL_AFTER="5")
    launch = Launch(launcher_cmd(sys.executable, str(WORKERS / "slow_dying_rank.py")), env)
    launches.append(launch)
    status = launch.wait(120)
    # torchrun's teardown may end rank 1's slow exit: then the status is rank 0's
    assert ("job failed: rank 1 on node 0 (127.0.0.1) exited with status 7 first" in
            launch.stderr and status == 7) or (
        "job failed: rank 1 on node 0 (127.0.0.1) failed (rank 0 lost its connection to it;"
        in launch.stderr and status == 1), launch.stderr
    assert not launch.leftovers()
