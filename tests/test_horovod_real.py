"""Horovod for real: horovod 0.28.1 (scripts/build_horovod.sh) with gloo on CPU.

Few runs, each checking several things, because every worker pays Horovod's
and torch's start-up. The three ways to start it: horovodrun on one node,
two simulated nodes without ssh (our launchers plus Horovod's rendezvous
server), and two simulated nodes over a real OpenSSH server.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from determined_launch.backends.ssh import HostFacts
from tests._burst import problems, write_burst
from tests._hvdds_helpers import (
    Launch,
    assert_failure_stops_both_nodes,
    assert_sigterm_stops_every_worker,
    check_worker_lines,
    installed,
    node_launches,
    real_env,
    worker,
)
from tests.conftest import free_port_block, launcher_cmd

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not installed("horovod"), reason="horovod is not installed (scripts/build_horovod.sh)"
    ),
]
MODULE = "determined_launch.horovod"
TWO_NODES = ["127.0.0.1", "127.0.0.2"]


def check_ranks(out: str, ranks: range, world: int, **expect: str) -> dict[int, dict[str, str]]:
    lines = check_worker_lines(out, ranks, world, **expect)
    for r in ranks:
        assert lines[r]["gathered"] == str(list(range(world))), lines[r]  # allgather_object
    return lines


def test_single_node_two_workers_under_horovodrun(tmp_path: Path, launches: list[Launch]) -> None:
    launch = Launch(
        launcher_cmd(*worker("hvd_worker.py"), module=MODULE),
        real_env(tmp_path / "tmp", DET_LAUNCH_SLOTS="2"),
    )
    launches.append(launch)
    assert launch.wait(300) == 0, launch.stdout + launch.stderr
    lines = check_ranks(launch.stdout, range(2), 2, cross="0/1")
    assert [lines[r]["local"] for r in range(2)] == ["0/2", "1/2"]
    assert "job succeeded" in launch.stderr
    assert launch.leftovers() == []


def test_ranks_flooding_horovodrun_reach_stdout_whole(tmp_path: Path,
                                                      launches: list[Launch]) -> None:
    """Issue 24 through horovodrun: two ranks as fast as they can. Before,
    with PYTHONUNBUFFERED (as in many containers), horovodrun's forwarding
    threads wrote to its stdout at once: a short line landed inside a long
    one (6 of each rank's 2,000 lines lost in one run), and the cut-off rests
    kept the tools' log after a successful job."""
    burst, n = write_burst(tmp_path), 2_000
    launch = Launch(
        launcher_cmd(sys.executable, str(burst), str(n), module=MODULE),
        real_env(tmp_path / "tmp", DET_LAUNCH_SLOTS="2", PYTHONUNBUFFERED="1"),
    )
    launches.append(launch)
    assert launch.wait(120) == 0, launch.stderr
    assert problems(launch.stdout.encode(), 2, n) == []
    assert "launcher tools' log" not in launch.stderr  # horovodrun's own noise only: deleted
    assert list((tmp_path / "tmp").glob("det-launch-tools-*")) == []


def test_two_nodes_without_ssh(tmp_path: Path, launches: list[Launch]) -> None:
    nodes = node_launches(tmp_path, MODULE, worker("hvd_worker.py"), TWO_NODES, [2, 2])
    launches += nodes
    for node in reversed(nodes):
        assert node.wait(300) == 0, node.stdout + node.stderr
    chief = check_ranks(nodes[0].stdout, range(0, 2), 4)
    peer = check_ranks(nodes[1].stdout, range(2, 4), 4)
    assert [chief[r]["cross"] for r in (0, 1)] == ["0/2", "0/2"]
    assert [peer[r]["cross"] for r in (2, 3)] == ["1/2", "1/2"]
    assert [peer[r]["local"] for r in (2, 3)] == ["0/2", "1/2"]
    assert all(n.leftovers() == [] for n in nodes)


def test_two_nodes_over_ssh(tmp_path: Path, launches: list[Launch]) -> None:
    """The peer runs only sshd (real OpenSSH, generated keys, private port);
    the chief's horovodrun starts the peer's ranks through it. Those ranks
    see their own node's job directory, and the secret is on no command line."""
    facts = HostFacts.current()
    if not (facts.sshd and facts.ssh):
        pytest.skip("ssh mode needs the OpenSSH server and client (apt: openssh-server)")
    nodes = node_launches(
        tmp_path,
        MODULE,
        ["--ssh", "--", *worker("hvd_worker.py")],
        TWO_NODES,
        [2, 2],
        DTRAIN_SSH_PORT=str(free_port_block(1)),
    )
    launches += nodes
    assert nodes[0].wait(300) == 0, nodes[0].stdout + nodes[0].stderr
    assert nodes[1].wait(60) == 0, nodes[1].stdout + nodes[1].stderr
    lines = check_ranks(nodes[0].stdout, range(4), 4)  # horovodrun gathers all output
    for r in range(4):
        assert lines[r]["jobdir"].startswith(str(tmp_path / f"tmp{r // 2}")), lines[r]
    assert "job succeeded on 2 nodes" in nodes[1].stderr
    assert all(n.leftovers() == [] for n in nodes)


def test_failure_without_ssh_stops_both_nodes(tmp_path: Path, launches: list[Launch]) -> None:
    nodes = node_launches(
        tmp_path, MODULE, worker("hvd_worker.py"), TWO_NODES, [1, 1], FAIL_RANK="1", FAIL_CODE="7"
    )
    launches += nodes
    assert_failure_stops_both_nodes(nodes)


def test_sigterm_stops_horovodrun_and_every_worker(tmp_path: Path, launches: list[Launch]) -> None:
    assert_sigterm_stops_every_worker(tmp_path, launches, MODULE, "hvd_worker.py")
