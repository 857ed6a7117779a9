"""Synchronized preemption with real launchers, real processes and the real
DistributedContext: 2 simulated nodes x 2 slots on loopback."""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import pytest

from determined_launch.errors import EXIT_PREEMPTED
from tests.conftest import (
    WORKERS,
    Launch,
    base_env,
    free_port_block,
    wait_for_file,
    write_cluster_info,
)

pytestmark = pytest.mark.slow
GRACE = 20.0


def start_two_nodes(
    tmp_path: Path, argv: list[str], launches: list[Launch], **extra: str
) -> tuple[Launch, Launch]:
    """Two launchers, as two nodes of one job would run them."""
    port = free_port_block()
    nodes = []
    for rank in (0, 1):
        info = write_cluster_info(
            tmp_path / f"node{rank}.json",
            container_addrs=["127.0.0.1", "127.0.0.1"],
            container_rank=rank,
            container_slot_counts=[2, 2],
            trial={"trial_id": 4, "hparams": {"increment_by": 1}, "max_length": 100},
        )
        env = base_env(
            DET_CLUSTER_INFO_FILE=str(info),
            C10D_PORT=str(port),
            DET_DIST_SECRET="preempt-test-secret-0123456789",
            DET_PREEMPT_GRACE=str(GRACE),
            **extra,
        )
        launch = Launch(argv, env)
        launches.append(launch)
        nodes.append(launch)
    return nodes[0], nodes[1]


@pytest.mark.parametrize("block", [False, True], ids=["nonblocking", "blocking"])
def test_signal_to_non_chief_launcher_stops_all_ranks_on_the_same_call(
    tmp_path: Path, launches: list[Launch], block: bool
) -> None:
    argv = [sys.executable, str(WORKERS / "core_preempt.py"), "launcher"]
    chief, other = start_two_nodes(
        tmp_path,
        argv,
        launches,
        PREEMPT_BLOCK="1" if block else "0",
        DET_RUN_DIR=str(tmp_path / "run"),
    )
    wait_for_file(tmp_path / "run" / "training.jsonl", 60, "the chief's first report")
    t0 = time.monotonic()
    other.send_signal(signal.SIGUSR1)
    statuses = [other.wait(GRACE + 15), chief.wait(GRACE + 15)]
    took = time.monotonic() - t0
    out = chief.stdout + other.stdout
    stops = {int(r): int(c) for r, c in re.findall(r"stopped rank=(\d) call=(\d+)", out)}
    assert sorted(stops) == [0, 1, 2, 3], (out, chief.stderr, other.stderr)
    assert len(set(stops.values())) == 1, stops
    assert statuses == [EXIT_PREEMPTED, EXIT_PREEMPTED], (chief.stderr, other.stderr)
    assert took < GRACE, took
    for launch in (chief, other):
        assert "preempted after the workers acknowledged" in launch.stderr
        assert launch.leftovers() == []
