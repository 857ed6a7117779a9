"""``det-launch exec -- CMD``: CMD once per node, with cluster info, secret
and supervision (Determined's plain entrypoint)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from determined_launch.backends import exec as exec_backend
from determined_launch.backends.plan import BackendArgs, JobRuntime
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import LaunchError
from tests.conftest import WORKERS, Launch, exec_on_two_nodes

EXEC_NODE = str(WORKERS / "exec_node.py")


def runtime() -> JobRuntime:
    return JobRuntime(job_dir="/j", master_port=1, control_port=2, dist_port=3,
                      secret="s" * 32, python=sys.executable)


def info(rank: int = 0) -> ClusterInfo:
    return ClusterInfo.from_mapping(
        {"container_addrs": ["a", "b"], "container_rank": rank,
         "container_slot_counts": [2, 2]}, source="test", where="test")


def test_plan_runs_the_command_once_with_the_job_environment() -> None:
    plan = exec_backend.build_plan(info(1), runtime(), BackendArgs((), ("python", "x.py")))
    (proc,) = plan.processes
    assert proc.argv == ("python", "x.py") and proc.name == "the command"
    assert plan.env["DET_CLUSTER_INFO_FILE"] == "/j/cluster-info.json"
    assert plan.env["DET_DIST_SECRET"] == "s" * 32 and plan.env["DET_CHIEF_IP"] == "a"


def test_plan_refuses_backend_options() -> None:
    with pytest.raises(LaunchError, match="exec takes no options before '--'"):
        exec_backend.build_plan(info(), runtime(), BackendArgs(("--nproc",), ("x",)))


def two_nodes(tmp_path: Path, launches: list[Launch], **extra: str) -> tuple[Launch, Launch]:
    chief, node1 = exec_on_two_nodes(tmp_path, [sys.executable, EXEC_NODE], launches, **extra)
    return chief, node1


@pytest.mark.slow
def test_two_nodes_build_a_distributed_context_by_hand(
    tmp_path: Path, launches: list[Launch]
) -> None:
    chief, node1 = two_nodes(tmp_path, launches)
    for launch, node in ((node1, 1), (chief, 0)):
        assert launch.wait(60) == 0, launch.stderr
        assert f"node={node} gathered=[0, 10] chief=127.0.0.1" in launch.stdout
        assert "job succeeded on 2 nodes" in launch.stderr
        assert launch.leftovers(settle=0.0) == []


@pytest.mark.slow
def test_a_failing_node_stops_the_other(tmp_path: Path, launches: list[Launch]) -> None:
    chief, node1 = two_nodes(tmp_path, launches, FAIL_NODE="1")
    for launch in (node1, chief):
        assert launch.wait(60) == 4, launch.stderr
        assert "the command on node 1 (127.0.0.1) exited with status 4 first" in (
            launch.stderr)
        assert launch.leftovers(settle=0.0) == []
