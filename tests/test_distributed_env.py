"""Rank layout and transport settings from the environment (pure functions)."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

from determined_launch.cluster.hostlist import parse_task_counts
from determined_launch.core.distributed import DistributedConfigError, DistributedContext
from determined_launch.core.distributed import env as dist_env
from determined_launch.core.distributed.env import Layout, detect

TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
}


def test_torchrun() -> None:
    assert detect(TORCHRUN) == Layout(5, 8, 1, 4, 1, 2, "torchrun", "10.0.0.1")


def test_torchrun_prefers_det_chief_ip_and_derives_missing_group() -> None:
    env = {k: v for k, v in TORCHRUN.items() if not k.startswith("GROUP")}
    env["DET_CHIEF_IP"] = "10.9.9.9"
    assert detect(env) == Layout(5, 8, 1, 4, 1, 2, "torchrun", "10.9.9.9")


def test_deepspeed() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_SIZE": "2",
        "CROSS_RANK": "1",
        "CROSS_SIZE": "2",
        "MASTER_ADDR": "h0",
    }
    assert detect(env) == Layout(3, 4, 1, 2, 1, 2, "deepspeed", "h0")


def test_horovod() -> None:
    env = {
        "HOROVOD_RANK": "2",
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2",
        "OMPI_COMM_WORLD_RANK": "0",  # horovodrun over mpirun: Horovod's own wins
    }
    assert detect(env) == Layout(2, 4, 0, 2, 1, 2, "horovod", None)


def test_openmpi_derives_nodes_from_blocks() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
    }
    assert detect(env) == Layout(5, 6, 2, 3, 1, 2, "openmpi", None)


def test_pmi() -> None:
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert detect(env) == Layout(1, 2, 1, 2, 0, 1, "pmi", None)


def test_slurm() -> None:
    env = {
        "SLURM_PROCID": "4",
        "SLURM_NTASKS": "5",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "2",
        "SLURM_TASKS_PER_NODE": "2(x2),1",
        "SLURM_JOB_NODELIST": "gpu[07-09]",
    }
    assert detect(env) == Layout(4, 5, 0, 1, 2, 3, "slurm", "gpu07")


def test_torchrun_inside_slurm_wins() -> None:
    env = dict(TORCHRUN, SLURM_PROCID="0", SLURM_NTASKS="2")
    assert detect(env).source == "torchrun"  # type: ignore[union-attr]


def test_nothing_detected() -> None:
    assert detect({"PATH": "/bin"}) is None


@pytest.mark.parametrize(
    "env,message",
    [
        (dict(TORCHRUN, RANK="x"), "RANK='x' is not an integer"),
        ({"RANK": "0", "LOCAL_WORLD_SIZE": "2"}, "WORLD_SIZE is not set"),
        (
            {"PMI_RANK": "0", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
            "multiple",
        ),
        ({"SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "two"}, "parse"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(DistributedConfigError, match=message):
        detect(env)


def test_tasks_per_node_and_first_host() -> None:
    count = functools.partial(dist_env._slurm, parse_task_counts, var="X")
    assert count("4(x2),3,1(x1)") == [4, 4, 3, 1]
    with pytest.raises(DistributedConfigError, match="X: cannot parse"):
        count("4(x")


def test_port_resolution_order() -> None:
    assert dist_env.resolve_port(1234, {"DET_DIST_PORT": "99"}) == 1234
    assert dist_env.resolve_port(None, {"DET_DIST_PORT": "99", "MASTER_PORT": "5"}) == 99
    assert dist_env.resolve_port(None, {"MASTER_PORT": "29500"}) == 29502
    assert dist_env.resolve_port(None, {}) == dist_env.DEFAULT_PORT
    with pytest.raises(DistributedConfigError, match="invalid"):
        dist_env.resolve_port(None, {"DET_DIST_PORT": "70000"})


def test_timeout_secret_and_transport_resolution() -> None:
    assert dist_env.resolve_timeout(None, {"DET_DIST_TIMEOUT": "2.5"}) == 2.5
    assert dist_env.resolve_timeout(None, {}) is None
    with pytest.raises(DistributedConfigError, match="DET_DIST_TIMEOUT"):
        dist_env.resolve_timeout(None, {"DET_DIST_TIMEOUT": "soon"})
    assert dist_env.resolve_secret(None, {"DET_DIST_SECRET": "s" * 16}) == "s" * 16
    assert dist_env.resolve_secret(None, {"DET_DIST_SECRET": ""}) is None
    with pytest.raises(DistributedConfigError, match="DET_DIST_SECRET is too short"):
        dist_env.resolve_secret(None, {"DET_DIST_SECRET": "short"})
    assert dist_env.resolve_transport(None, {}) == "direct"
    assert dist_env.resolve_transport(None, {"DET_DIST_TRANSPORT": "zmq"}) == "zmq"
    with pytest.raises(DistributedConfigError, match="carrier-pigeon"):
        dist_env.resolve_transport("carrier-pigeon", {})


def test_private_dir_must_be_0700_and_ours(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert dist_env.private_dir(str(private)) == str(private)
    assert dist_env.private_dir(str(shared)) is None
    assert dist_env.private_dir(str(tmp_path / "missing")) is None
    assert dist_env.private_dir(None) is None


def test_from_torch_distributed_without_torchrun_is_a_config_error() -> None:
    with pytest.raises(DistributedConfigError, match="torchrun"):
        DistributedContext.from_torch_distributed(env={"PATH": "/bin"})
    with pytest.raises(DistributedConfigError, match="deepspeed"):
        DistributedContext.from_deepspeed(env={"PATH": "/bin"})


def test_from_env_single_rank_layouts_need_no_sockets() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}  # fmt: skip
    ctx = DistributedContext.from_env(env=env)
    assert (ctx.size, ctx._wiring) == (1, None)


@pytest.mark.parametrize("nodelist,chief", [
    ("localhost", "localhost"),
    ("localhost,node[001-004,9]", "localhost"),
])
def test_slurm_chief_is_the_first_host_of_the_one_hostlist_parser(
    nodelist: str, chief: str
) -> None:
    assert dist_env.slurm_chief({"SLURM_STEP_NODELIST": nodelist}) == chief


def test_slurm_chief_that_does_not_resolve_fails_at_once_naming_it() -> None:
    # r[1-2]n[1-2] starts with r1n1 (a regex "first host" said r1, which exists nowhere)
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "1(x2)",
           "SLURM_JOB_NODELIST": "r[1-2]n[1-2].invalid", "DET_DIST_SECRET": "s" * 32}
    started = time.monotonic()
    with pytest.raises(DistributedConfigError, match=r"first host 'r1n1.invalid' \(the chief\)"):
        DistributedContext.from_env(env=env)
    assert time.monotonic() - started < 10  # not a connection timeout
