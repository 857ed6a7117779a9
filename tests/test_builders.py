"""Command builders are pure: ClusterInfo + runtime + args -> LaunchPlan."""

from __future__ import annotations

import signal

import pytest

from determined_launch import values
from determined_launch.backends.per_slot import per_slot_plan
from determined_launch.backends.plan import BackendArgs, JobRuntime
from determined_launch.backends.torch_distributed import build_plan, torchrun_argv
from determined_launch.cluster import ClusterInfo
from determined_launch.errors import LaunchError
from determined_launch.launch import config
from determined_launch.launch.launcher import _ports, job_secret, split_overrides

RUNTIME = JobRuntime(
    job_dir="/j", master_port=29400, control_port=29401, dist_port=29402, secret="k" * 32,
    python="/py",
)


def info(rank: int = 0, addrs: tuple[str, ...] = ("10.0.0.1", "10.0.0.2"),
         counts: tuple[int, ...] = (2, 2)) -> ClusterInfo:
    return ClusterInfo.from_mapping(
        {"container_addrs": list(addrs), "container_rank": rank,
         "container_slot_counts": list(counts)},
        source="test", where="test",
    )


def test_torchrun_multi_node_argv() -> None:
    argv = torchrun_argv(info(1), RUNTIME, BackendArgs((), ("train.py", "--lr", "1")))
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    pairs = dict(zip(argv[3:17:2], argv[4:17:2]))
    assert pairs == {
        "--nnodes": "2", "--nproc_per_node": "2", "--node_rank": "1",
        "--master_addr": "10.0.0.1", "--master_port": "29400", "--max_restarts": "0",
        "--monitor_interval": "0.1",
    }
    assert argv[-8:] == ["/py", "-m", "wrap_rank", "RANK", "--", "train.py", "--lr", "1"]


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ((), ["--log-dir", "/j/torchelastic"]),  # inside the job directory, removed at the end
        (("--log-dir", "/keep"), []),
        (("--log_dir=/keep",), []),
        (("--redirects", "3"), []),  # the user wants the log files: torchrun's own place
        (("-r3",), []),
        (("--tee", "3"), []),
        (("-t", "1"), []),
        (("--max_restarts", "3"), ["--log-dir", "/j/torchelastic"]),
    ],
)
def test_torchrun_logs_go_to_the_job_directory_unless_asked_for(
    overrides: tuple[str, ...], expected: list[str]
) -> None:
    argv = torchrun_argv(info(), RUNTIME, BackendArgs(overrides, ("t.py",)))
    ours = argv[argv.index("--no_python") + 1 : argv.index("--no_python") + 1 + len(expected)]
    assert ours == expected
    assert argv.count("--log-dir") == len(expected) // 2 + overrides.count("--log-dir")


def test_single_node_uses_loopback() -> None:
    argv = torchrun_argv(info(0, ("10.9.9.9",), (4,)), RUNTIME, BackendArgs((), ("t.py",)))
    assert argv[argv.index("--master_addr") + 1] == "127.0.0.1"


def test_overrides_come_after_defaults_so_they_win() -> None:
    argv = torchrun_argv(info(), RUNTIME, BackendArgs(("--max_restarts", "3"), ("t.py",)))
    assert argv.index("--max_restarts", argv.index("--max_restarts") + 1) < argv.index("wrap_rank")


def test_plan_env() -> None:
    plan = build_plan(info(1), RUNTIME, BackendArgs((), ("t.py",)))
    assert plan.env["DET_CHIEF_IP"] == "10.0.0.1"
    assert plan.env["USE_TORCH_DISTRIBUTED"] == "true"
    assert plan.env["DET_DIST_SECRET"] == "k" * 32
    assert plan.env["DET_DIST_PORT"] == "29402"
    assert plan.env["WRAP_RANK_STATUS_DIR"] == "/j/exit-status"
    assert "RANK" in plan.unset_env and "MASTER_PORT" in plan.unset_env
    assert "k" * 32 not in plan.render()


def test_per_slot_ranks_with_uneven_nodes() -> None:
    plan = per_slot_plan(info(1, counts=(3, 2)), RUNTIME, lambda r, lr: ["w", str(r), str(lr)])
    assert [p.argv[-3:] for p in plan.processes] == [("w", "3", "0"), ("w", "4", "1")]
    assert [p.argv[3] for p in plan.processes] == ["3", "4"]  # wrap_rank's RANK argument
    assert plan.processes[1].env["WORLD_SIZE"] == "5"
    assert plan.processes[1].env["CROSS_RANK"] == "1"


def test_split_overrides() -> None:
    assert split_overrides(["--a", "1", "--", "x.py", "--", "y"], "u") == BackendArgs(
        ("--a", "1"), ("x.py", "--", "y")
    )
    assert split_overrides(["x.py"], "u") == BackendArgs((), ("x.py",))
    with pytest.raises(LaunchError, match="no command to run"):
        split_overrides(["--nproc_per_node", "2", "--"], "u")


def test_parse_signals() -> None:
    assert values.signals("USR1@90") == (signal.SIGUSR1,)
    assert values.signals("TERM, sigusr2") == (signal.SIGTERM, signal.SIGUSR2)
    # No value: the option table's default.
    assert config.resolve({"DET_PREEMPT_SIGNALS": ""})["preempt_signals"] == (
        signal.SIGTERM, signal.SIGUSR1)
    with pytest.raises(LaunchError, match="DET_PREEMPT_SIGNALS: unknown signal 'BOGUS'"):
        config.resolve({"DET_PREEMPT_SIGNALS": "BOGUS"})
    with pytest.raises(ValueError, match="cannot be caught"):
        values.signals("KILL")


def test_ports() -> None:
    assert _ports(info(), {"C10D_PORT": "30000"}) == (30000, 30001, 30002)
    assert _ports(info(), {}) == (29400, 29401, 29402)
    single = _ports(info(0, ("127.0.0.1",), (1,)), {})
    assert len(set(single)) == 3
    with pytest.raises(LaunchError, match="C10D_PORT: expected a port"):
        _ports(info(), {"C10D_PORT": "http"})


def test_job_secret_sources(capsys: pytest.CaptureFixture[str]) -> None:
    assert job_secret(info(), {"DET_DIST_SECRET": "e" * 20}) == "e" * 20
    one = info(0, ("127.0.0.1",), (1,))
    assert job_secret(one, {}) != job_secret(one, {})  # fresh per single-node job
    derived = job_secret(info(0), {})
    assert derived == job_secret(info(1), {})  # every node derives the same key
    assert "WARNING: no job secret" in capsys.readouterr().err
