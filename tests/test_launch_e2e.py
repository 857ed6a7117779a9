"""End to end: real torchrun, real gloo, real processes, one or two launchers."""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import (
    WORKERS,
    Launch,
    base_env,
    free_port_block,
    launcher_cmd,
    wait_for_file,
    write_cluster_info,
)

pytestmark = pytest.mark.slow
ALLREDUCE = [sys.executable, str(WORKERS / "allreduce.py")]


def sums(out: str) -> dict[int, int]:
    return {int(r): int(s) for r, s in re.findall(r"rank=(\d+) sum=(\d+)", out)}


def test_four_workers_one_node_allreduce(tmp_path: Path, launches: list[Launch]) -> None:
    # Its own TMPDIR: torchrun makes a torchelastic_* directory there per run and
    # never removes it; ours is pointed into the job directory instead.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    launch = Launch(launcher_cmd(*ALLREDUCE), base_env(DET_LAUNCH_SLOTS="4", TMPDIR=str(tmp)))
    launches.append(launch)
    assert launch.wait(120) == 0, launch.stderr
    assert sums(launch.stdout) == {0: 10, 1: 10, 2: 10, 3: 10}
    for r in range(4):
        assert f"[rank={r}] world=4 rank={r} sum=10 chief=127.0.0.1" in launch.stdout
    assert "job succeeded" in launch.stderr
    assert launch.leftovers() == []
    assert list(tmp.iterdir()) == []  # no torchelastic_* left, and the job directory is gone


def two_node_launches(
    tmp_path: Path,
    slots: tuple[int, int] = (2, 2),
    worker: tuple[str, ...] = tuple(ALLREDUCE),
    **extra: str,
) -> tuple[Launch, Launch]:
    port = free_port_block()
    secret = "s" * 32
    launches = []
    for rank in (0, 1):
        info = write_cluster_info(
            tmp_path / f"node{rank}.json",
            container_addrs=["127.0.0.1", "127.0.0.1"],
            container_rank=rank,
            container_slot_counts=list(slots),
        )
        env = base_env(
            DET_CLUSTER_INFO_FILE=str(info),
            C10D_PORT=str(port),
            DET_DIST_SECRET=secret,
            **extra,
        )
        launches.append(Launch(launcher_cmd(*worker), env))
    return launches[0], launches[1]


def test_two_simulated_nodes_form_one_world(tmp_path: Path, launches: list[Launch]) -> None:
    chief, node1 = two_node_launches(tmp_path)
    launches += [chief, node1]
    assert node1.wait(120) == 0, node1.stderr
    assert chief.wait(30) == 0, chief.stderr
    assert sums(chief.stdout) == {0: 10, 1: 10}
    assert sums(node1.stdout) == {2: 10, 3: 10}
    assert "world=4" in node1.stdout
    assert chief.leftovers() == [] and node1.leftovers() == []


def test_uneven_slot_counts_work(tmp_path: Path, launches: list[Launch]) -> None:
    chief, node1 = two_node_launches(tmp_path, slots=(2, 1))
    launches += [chief, node1]
    assert node1.wait(120) == 0, node1.stderr
    assert chief.wait(30) == 0, chief.stderr
    assert {**sums(chief.stdout), **sums(node1.stdout)} == {0: 6, 1: 6, 2: 6}


def test_rank_failure_on_node1_stops_both_launchers(tmp_path: Path, launches: list[Launch]) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    chief, node1 = two_node_launches(
        tmp_path, FAIL_RANK="3", FAIL_CODE="3", READY_DIR=str(ready), DET_KILL_AFTER="3"
    )
    launches += [chief, node1]
    wait_for_file(ready / "rank-3", 120, "rank 3's first collective")
    failed_at = time.monotonic()
    assert node1.wait(60) == 3, node1.stderr
    assert chief.wait(30) == 3, chief.stderr
    # Well under any gloo/NCCL timeout: the control channel stopped node 0.
    assert time.monotonic() - failed_at < 20
    for launch in (chief, node1):
        assert "job failed: rank 3 on node 1 (127.0.0.1) exited with status 3 first" in (
            launch.stderr
        ), launch.stderr
        assert launch.leftovers() == []


def test_sigterm_to_launcher_leaves_no_process(tmp_path: Path, launches: list[Launch]) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    env = base_env(
        DET_LAUNCH_SLOTS="2",
        SLEEP_FOREVER="1",
        READY_DIR=str(ready),
        DET_PREEMPT_GRACE="1",
        DET_KILL_AFTER="3",
    )
    launch = Launch(launcher_cmd(*ALLREDUCE), env)
    launches.append(launch)
    wait_for_file(ready / "rank-1", 120, "both ranks running")
    launch.send_signal(signal.SIGTERM)
    status = launch.wait(30)
    # No worker watches for preemption, so there is no grace period to wait.
    assert status == 143
    assert "no worker watches for preemption, so the job stopped at once" in launch.stderr
    assert launch.leftovers() == []


def test_bad_cluster_info_exits_2_and_starts_nothing(
    tmp_path: Path, launches: list[Launch]
) -> None:
    info = write_cluster_info(
        tmp_path / "bad.json",
        container_addrs=["127.0.0.1"],
        container_rank=0,
        container_slot_counts=["two"],
    )
    marker = tmp_path / "started"
    launch = Launch(
        launcher_cmd(sys.executable, "-c", f"open({str(marker)!r}, 'w')"),
        base_env(DET_CLUSTER_INFO_FILE=str(info)),
    )
    launches.append(launch)
    assert launch.wait(30) == 2
    assert launch.stderr.strip().splitlines() == [
        f"det-launch: error: cluster info file {info}: field 'container_slot_counts[0]': "
        'expected an integer, got "two"'
    ]
    assert not marker.exists()


def test_preemption_signal_on_node1_reaches_every_node(
    tmp_path: Path, launches: list[Launch]
) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    worker = (sys.executable, str(WORKERS / "preempt_poll.py"))
    nodes = two_node_launches(tmp_path, (1, 1), worker, READY_DIR=str(ready))
    launches += list(nodes)
    for r in (0, 1):
        wait_for_file(ready / f"rank-{r}", 120, f"rank {r}")
    time.sleep(0.5)  # both launchers are past their control-channel handshake
    sent = time.time()
    nodes[1].send_signal(signal.SIGUSR1)
    assert nodes[1].wait(30) == 75, nodes[1].stderr
    assert nodes[0].wait(30) == 75, nodes[0].stderr
    seen = [float((ready / f"seen-{r}").read_text()) for r in (0, 1)]
    assert max(seen) - sent < 1.0, seen  # the chief's node saw node 1's signal within 1 s
    for node in nodes:
        assert "job preempted after the workers acknowledged; resumable (exit status 75)" in (
            node.stderr
        )
        assert node.leftovers() == []


def test_sigkill_to_launcher_still_leaves_no_process(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """The launcher cannot clean up after SIGKILL; its children's
    parent-death signal makes torchrun stop its own workers instead."""
    ready = tmp_path / "ready"
    ready.mkdir()
    env = base_env(DET_LAUNCH_SLOTS="2", SLEEP_FOREVER="1", READY_DIR=str(ready))
    launch = Launch(launcher_cmd(*ALLREDUCE), env)
    launches.append(launch)
    wait_for_file(ready / "rank-1", 120, "both ranks running")
    launch.send_signal(signal.SIGKILL)
    assert launch.wait(10) == -signal.SIGKILL
    assert launch.leftovers(settle=30) == []
