"""Multi-node trials of det-launch experiment (experiment/gang.py): who is a
trial's chief, the bad-input checks, and two `--worker` processes as two
simulated nodes on loopback running each trial across both."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import LaunchError
from determined_launch.experiment import gang
from determined_launch.experiment.gang import trial_gang
from determined_launch.experiment.trial import TrialProcess, TrialSpec
from determined_launch.supervisor.control import NodeLink
from tests.conftest import Launch, base_env, free_port_block, launches, write_cluster_info

__all__ = ["launches"]  # the fixture


def allocation(rank: int, nodes: int = 4, slots: int = 2) -> ClusterInfo:
    return ClusterInfo(tuple(f"10.0.0.{i}" for i in range(nodes)), rank, (slots,) * nodes,
                       tuple(range(slots)), "test", job_secret="s" * 32)


def test_groups_of_consecutive_nodes_each_led_by_their_first() -> None:
    gangs = [trial_gang(4, allocation(r), "c.yaml") for r in range(4)]
    assert [(g.nodes, g.group, g.rank) for g in gangs if g] == [
        (2, 0, 0), (2, 0, 1), (2, 1, 0), (2, 1, 1)]
    g = gangs[3]
    assert g is not None and g.info.container_addrs == ("10.0.0.2", "10.0.0.3")
    assert (g.info.container_rank, g.info.container_slot_counts) == (1, (2, 2))
    assert g.info.chief_ip == "10.0.0.2" and g.info.job_secret == "s" * 32


def test_a_node_left_over_and_trials_of_one_node() -> None:
    assert trial_gang(6, allocation(3), "c.yaml") is None  # groups of 3 nodes: node 3 is spare
    one = trial_gang(1, allocation(2), "c.yaml")  # smaller than a node: its own, part of it
    assert one is not None and (one.nodes, one.group, one.rank) == (1, 2, 0)
    assert one.info.container_addrs == ("10.0.0.2",) and one.info.slot_ids == (0,)
    default = trial_gang(None, allocation(1), "c.yaml")  # no slots_per_trial: a node each
    assert default is not None and default.info.container_slot_counts == (2,)


@pytest.mark.parametrize("spt, info, expected", [
    (3, allocation(0), "c.yaml: resources.slots_per_trial 3 is not a multiple of the 2 slots "
                       "per node of this allocation"),
    (10, allocation(0), "c.yaml: resources.slots_per_trial 10 needs 5 nodes of 2 slots; this "
                        "allocation has 4"),
    (4, ClusterInfo(("a", "b"), 0, (2, 4), (0, 1), "test"),
     "c.yaml: resources.slots_per_trial 4 spans nodes, whose slot counts differ in this "
     "allocation (2, 4); a trial across nodes needs the same number on each"),
])
def test_bad_shapes_are_one_line_usage_errors(spt: int, info: ClusterInfo, expected: str) -> None:
    with pytest.raises(LaunchError) as e:
        trial_gang(spt, info, "c.yaml")
    assert str(e.value) == expected and e.value.exit_status == 2


def test_the_chief_announces_each_run_waits_for_it_and_names_a_lost_node(tmp_path: Path) -> None:
    """Real links on loopback, no launchers: what node 1's worker is told, that
    the next run waits for its launcher of the last one, and a lost worker."""
    loopback = ClusterInfo(("127.0.0.1",) * 2, 0, (1, 1), (0,), "test")
    chief_gang = trial_gang(2, loopback, "c.yaml")
    assert chief_gang is not None
    port, secret, nodes = free_port_block(1), "t" * 32, []
    joiner = threading.Thread(target=lambda: nodes.append(NodeLink(
        "127.0.0.1", port, 1, gang.derive(secret, "group 0"), 10, num_nodes=2)))
    joiner.start()
    chief = gang.GangChief(chief_gang, secret, port, 10, lambda _: None)
    joiner.join()
    [node] = nodes
    proc = TrialProcess(TrialSpec(4, {"lr": 0.1}, 7, 3, 8), tmp_path, "loss", None)
    env = chief.before_start(proc)
    assert env == {"DET_DIST_SECRET": gang.run_secret(secret, 0, 1)}
    msg = _next(node)
    assert (msg["type"], msg["run"], msg["number"], msg["hparams"], msg["latest_checkpoint"]) == (
        gang.RUN, 1, 4, {"lr": 0.1}, None)
    assert chief.running == {1}
    node.send({"type": gang.EXITED, "run": 1, "code": 3})
    chief.settle()  # returns once node 1's launcher of run 1 has ended
    chief.before_start(proc)
    assert _next(node)["run"] == 2
    node.send({"type": gang.EXITED, "run": 2, "code": 3})
    node.close()  # then the worker on node 1 goes away: no run can start without it
    deadline = time.monotonic() + 10
    while chief.check() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(gang.GangError, match=r"worker on node 1 of this trial group was lost "
                       r"\(its connection closed: the experiment worker was killed or crashed\)"):
        chief.before_start(proc)
    chief.finish(1)


def test_a_node_signalled_between_trials_leaves_at_once(tmp_path: Path) -> None:
    """A TERM to a node's worker while it runs no trial has nothing to preempt:
    it leaves with one line (it used to wait for the search's end), and the
    chief sees the worker lost."""
    import os
    import signal

    loopback = ClusterInfo(("127.0.0.1",) * 2, 0, (1, 1), (0,), "test")
    chief_gang = trial_gang(2, loopback, "c.yaml")
    node_gang = trial_gang(2, ClusterInfo(("127.0.0.1",) * 2, 1, (1, 1), (0,), "test"), "c.yaml")
    assert chief_gang is not None and node_gang is not None
    port, secret, chiefs = free_port_block(1), "t" * 32, []
    opener = threading.Thread(target=lambda: chiefs.append(
        gang.GangChief(chief_gang, secret, port, 10, lambda _: None)))
    opener.start()
    setup = gang.NodeSetup(node_gang, secret, port, 10, tmp_path, [], {}, str(tmp_path), "loss",
                           lambda _: None)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        with pytest.raises(gang.Interrupted,
                           match="^node 1 of trial group 0: stopped by SIGTERM between trials$"):
            gang.serve_node(setup)  # in the main thread: the signal reaches its handler
    finally:
        timer.cancel()
        opener.join()
    [chief] = chiefs
    deadline = time.monotonic() + 10
    while chief.check() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert chief.lost is not None and "worker on node 1" in chief.lost
    chief.finish(1)


def _next(link: NodeLink, timeout: float = 10) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while not link.inbox:
        assert time.monotonic() < deadline, "no message"
        time.sleep(0.01)
    return link.inbox.popleft()


def two_node_env(tmp_path: Path, rank: int, port: int) -> dict[str, str]:
    info = write_cluster_info(tmp_path / f"node{rank}.json",
                              container_addrs=["127.0.0.1", "127.0.0.1"],
                              container_rank=rank, container_slot_counts=[1, 1])
    return base_env(DET_CLUSTER_INFO_FILE=str(info), C10D_PORT=str(port),
                    DET_DIST_SECRET="g" * 32, DET_KILL_AFTER="3")


def config(tmp_path: Path, slots: int) -> Path:
    path = tmp_path / "gang.yaml"
    path.write_text(json.dumps({
        "name": "gang", "max_restarts": 1, "resources": {"slots_per_trial": slots},
        "hyperparameters": {"case": {"type": "categorical", "vals": ["plain", "flaky"]},
                            "cases": {"flaky": {"fail_once_on_node": 1}},
                            "x": 0.7, "layers": 2, "period": 2},
        "searcher": {"name": "grid", "metric": "loss", "max_length": 4}}))
    return path


def worker(tmp_path: Path, cfg: Path, env: dict[str, str]) -> list[str]:
    from tests.test_search import EXEC

    return [sys.executable, "-m", "determined_launch.cli", "experiment", str(cfg), "--worker",
            "--experiment-dir", str(tmp_path / "exp"), "--study-storage",
            str(tmp_path / "study.journal"), *EXEC]


def test_too_many_nodes_for_the_allocation_is_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from determined_launch.experiment.cli import main

    info = write_cluster_info(tmp_path / "node0.json", container_addrs=["127.0.0.1"] * 2,
                              container_rank=0, container_slot_counts=[1, 1])
    cfg = config(tmp_path, 4)
    argv = worker(tmp_path, cfg, {})[4:]  # in process: the same words after "experiment"
    env = {"DET_CLUSTER_INFO_FILE": str(info)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        code = main([*argv[:2], "--detector", "file", *argv[2:]])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        f"det-launch: error: {cfg}: resources.slots_per_trial 4 needs 4 nodes of 1 slots; this "
        "allocation has 2"], err


@pytest.mark.slow
def test_two_nodes_run_each_trial_together_and_restart_it_together(
        tmp_path: Path, launches: list[Launch]) -> None:
    """slots_per_trial 2 on two one-slot nodes: each trial is one launcher job
    across both (world size 2 in every report); the flaky trial's node 1 fails
    its first run, and the driver on node 0 restarts the trial on both nodes."""
    pytest.importorskip("optuna", reason="the [search] extra is not installed")
    cfg = config(tmp_path, 2)
    port = free_port_block(4)
    nodes = [Launch(worker(tmp_path, cfg, two_node_env(tmp_path, r, port)),
                    two_node_env(tmp_path, r, port)) for r in (1, 0)]  # any order
    launches.extend(nodes)
    codes = [n.wait(90) for n in nodes]
    node1, chief = nodes
    out = chief.stdout + chief.stderr + node1.stdout + node1.stderr
    assert codes == [0, 0], out
    trials = tmp_path / "exp" / "trials"
    assert sorted(p.name for p in trials.iterdir()) == ["1", "2"]
    for d in trials.iterdir():
        reports = [json.loads(line) for line in (d / "validation.jsonl").read_text().splitlines()]
        assert [r["metrics"]["world_size"] for r in reports] == [2, 2], d
        assert (d / "node1" / "ranks.log").read_text().split()[-1] == "1/2"
        assert (d / "ranks.log").read_text().split()[-1] == "0/2"
    assert "trial 1: completed" in chief.stdout and "trial 2: completed" in chief.stdout, out
    hparams = json.loads((trials / "1" / "cluster_info.json").read_text())["trial"]["hparams"]
    flaky = 1 if hparams["case"] == "flaky" else 2
    assert f"trial {flaky}: exit status" in chief.stdout and "restart 1 of 1" in chief.stdout
    runs = [line for line in node1.stdout.splitlines() if "started its node 1" in line]
    assert len(runs) == 3, out  # each trial once, the flaky one again with its restart
    ends = [line.split("exit status ")[1][0] for line in node1.stdout.splitlines()
            if "its node 1 ended" in line]
    assert sorted(ends) == ["0", "0", "3"], out
    assert not chief.leftovers() and not node1.leftovers()
