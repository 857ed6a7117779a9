"""Horovod for real: horovod 0.28.1 (scripts/build_horovod.sh) with gloo on CPU.

Few runs, each checking several things, because every worker pays Horovod's
and torch's start-up. The three ways to start it: horovodrun on one node,
two simulated nodes without ssh (our launchers plus Horovod's rendezvous
server), and two simulated nodes over a real OpenSSH server.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from determined_launch.backends.ssh import HostFacts
from tests._hvdds_helpers import (
    REPO,
    Launch,
    installed,
    node_launches,
    rank_lines,
    real_env,
    worker,
)
from tests.conftest import free_port_block, launcher_cmd, wait_for_file

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not installed("horovod"), reason="horovod is not installed (scripts/build_horovod.sh)"
    ),
]
MODULE = "determined_launch.horovod"
HAVE_DCTX = (REPO / "determined_launch" / "core" / "distributed.py").exists()
TWO_NODES = ["127.0.0.1", "127.0.0.2"]


def check_ranks(out: str, ranks: range, world: int, **expect: str) -> dict[int, dict[str, str]]:
    lines = rank_lines(out)
    assert set(lines) == set(ranks), out
    for r in ranks:
        f = lines[r]
        assert f["world"] == str(world), f
        assert f["sum"] == str(world * (world + 1) // 2), f  # allreduce of rank+1
        assert f["gathered"] == str(list(range(world))), f  # allgather_object
        assert f["use"] == "1" and f["chief"] == "127.0.0.1", f
        assert f["secret"] == "True" and f["leak"] == "False", f
        if HAVE_DCTX:
            assert f["dctx"] == "ok", f  # DistributedContext.from_horovod(hvd)
        for k, v in expect.items():
            assert f[k] == v, (k, f)
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
    assert nodes[1].wait(300) == 7, nodes[1].stdout + nodes[1].stderr
    failed_at = time.monotonic()
    assert nodes[0].wait(60) == 7, nodes[0].stdout + nodes[0].stderr
    assert time.monotonic() - failed_at < 20  # the control channel, not a gloo timeout
    for node in nodes:
        assert "job failed: rank 1 on node 1 (127.0.0.2) exited with status 7 first" in (
            node.stderr
        ), node.stderr
        assert node.leftovers() == []


def test_sigterm_stops_horovodrun_and_every_worker(tmp_path: Path, launches: list[Launch]) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    env = real_env(
        tmp_path / "tmp",
        DET_LAUNCH_SLOTS="2",
        SLEEP_FOREVER="1",
        DET_PREEMPT_GRACE="1",
        READY_DIR=str(ready),
    )
    launch = Launch(launcher_cmd(*worker("hvd_worker.py"), module=MODULE), env)
    launches.append(launch)
    for r in range(2):
        wait_for_file(ready / f"rank-{r}", 300, f"rank {r}")
    launch.send_signal(signal.SIGTERM)
    assert launch.wait(60) == 128 + signal.SIGTERM, launch.stderr
    assert "preemption grace period" in launch.stderr
    assert launch.leftovers() == []
