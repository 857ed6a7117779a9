"""The SLURM detector on environments recorded from real srun/sbatch runs
(slurm-wlm 22.05.8, the two-node test cluster of tests/slurm_cluster.py)."""

from __future__ import annotations

import pytest

from determined_launch.cluster import ClusterInfo, detect
from determined_launch.cluster.slurm import Slurm, task_hosts
from determined_launch.errors import ClusterInfoError

# scontrol's NodeAddr for the recorded cluster; DNS does not know n1/n2.
NODE_ADDRS = {"n1": "127.0.0.1", "n2": "127.0.0.2"}
slurm = Slurm(node_addrs=lambda names: {n: NODE_ADDRS[n] for n in names if n in NODE_ADDRS})

COMMON = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CLUSTER_NAME": "detlaunch"}


def step_env(procid: int, **extra: str) -> dict[str, str]:
    """`srun -N2 --ntasks-per-node=2`, recorded: task `procid` of 4."""
    node = procid // 2
    return {
        **COMMON,
        "SLURMD_NODENAME": f"n{node + 1}",
        "SLURM_GTIDS": "0,1" if node == 0 else "2,3",
        "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
        "SLURM_LOCALID": str(procid % 2),
        "SLURM_NNODES": "2",
        "SLURM_NODEID": str(node),
        "SLURM_NODELIST": "n[1-2]",
        "SLURM_NTASKS": "4",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_PROCID": str(procid),
        "SLURM_STEPID": "0",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        **extra,
    }


def node_env(node: int, **extra: str) -> dict[str, str]:
    """`srun -N2 --ntasks-per-node=1`, recorded: the task on node `node`."""
    return {
        **COMMON,
        "SLURMD_NODENAME": f"n{node + 1}",
        "SLURM_GTIDS": str(node),
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node),
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": str(node),
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        **extra,
    }


def info(env: dict[str, str]) -> ClusterInfo:
    result = slurm.detect(env)
    assert isinstance(result, ClusterInfo), result
    return result


def test_no_slurm() -> None:
    assert not isinstance(slurm.detect({}), ClusterInfo)


@pytest.mark.parametrize("node", [0, 1])
def test_one_launcher_per_node(node: int) -> None:
    i = info(node_env(node))
    assert i.container_addrs == ("127.0.0.1", "127.0.0.2")
    assert i.container_rank == node
    assert i.container_slot_counts == (1, 1)
    assert i.source == "slurm"


@pytest.mark.parametrize(
    "extra, slots",
    [
        ({"SLURM_GPUS_ON_NODE": "4"}, 4),
        ({"SLURM_STEP_GPUS": "0,1,2"}, 3),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 2),
        ({"DET_LAUNCH_SLOTS": "3", "SLURM_GPUS_ON_NODE": "4"}, 3),
    ],
)
def test_slots_per_node(extra: dict[str, str], slots: int) -> None:
    i = info(node_env(1, **extra))
    assert i.container_slot_counts == (slots, slots)
    assert i.total_slots == 2 * slots


@pytest.mark.parametrize("procid", range(4))
def test_one_task_per_slot_block(procid: int) -> None:
    """-N2 --ntasks-per-node=2: every task is a one-slot container."""
    i = info(step_env(procid))
    assert i.container_addrs == ("127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2")
    assert i.container_rank == procid
    assert i.container_slot_counts == (1, 1, 1, 1)


@pytest.mark.parametrize("procid, node", [(0, 0), (1, 1), (2, 0), (3, 1)])
def test_one_task_per_slot_cyclic(procid: int, node: int) -> None:
    """Recorded `srun -m cyclic` in the same allocation."""
    env = step_env(
        procid,
        SLURM_DISTRIBUTION="cyclic",
        SLURMD_NODENAME=f"n{node + 1}",
        SLURM_NODEID=str(node),
        SLURM_GTIDS="0,2" if node == 0 else "1,3",
    )
    i = info(env)
    assert i.container_addrs == ("127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2")
    assert i.container_rank == procid


def test_one_task_per_slot_refuses_shared_gpus() -> None:
    with pytest.raises(ClusterInfoError, match="this task sees 4 GPUs.*--gpus-per-task=1"):
        slurm.detect(step_env(1, CUDA_VISIBLE_DEVICES="0,1,2,3"))
    assert info(step_env(1, CUDA_VISIBLE_DEVICES="1")).container_rank == 1


def test_gtids_that_contradict_the_layout_are_refused() -> None:
    with pytest.raises(ClusterInfoError, match="SLURM_GTIDS=0,2 does not match"):
        slurm.detect(step_env(0, SLURM_GTIDS="0,2"))


def test_batch_script_of_a_multi_node_job_is_refused() -> None:
    """Recorded in `sbatch -N2 --ntasks-per-node=2`, outside srun."""
    env = {
        **COMMON,
        "SLURMD_NODENAME": "n1",
        "SLURM_GTIDS": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "0",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    with pytest.raises(ClusterInfoError, match=r"outside any srun step.*srun --ntasks-per-node=1"):
        slurm.detect(env)


def test_batch_script_of_a_one_node_job_uses_its_tasks_as_slots() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n2",
        "SLURMD_NODENAME": "n2",
        "SLURM_NODEID": "0",
        "SLURM_TASKS_PER_NODE": "4",
    }
    i = info(env)
    assert (i.container_addrs, i.container_rank, i.container_slot_counts) == (
        ("127.0.0.2",),
        0,
        (4,),
    )


def test_node_index_comes_from_the_step_not_the_job() -> None:
    """Recorded `srun -N1 -w n2` inside a two-node job: NODEID is 0."""
    env = node_env(0, SLURMD_NODENAME="n2", SLURM_STEP_NODELIST="n2", SLURM_STEP_TASKS_PER_NODE="1")
    i = info(env)
    assert i.container_addrs == ("127.0.0.2",)


def test_unresolvable_node_names_the_host() -> None:
    env = node_env(0, SLURM_STEP_NODELIST="n[1-3]", SLURM_STEP_TASKS_PER_NODE="1(x3)")
    with pytest.raises(ClusterInfoError, match="SLURM_STEP_NODELIST: cannot resolve host 'n3'"):
        slurm.detect(env)


def test_task_counts_must_match_the_node_list() -> None:
    with pytest.raises(ClusterInfoError, match="describes 3 nodes but SLURM_STEP_NODELIST names 2"):
        slurm.detect(node_env(0, SLURM_STEP_TASKS_PER_NODE="1(x3)"))


def test_unknown_distribution_is_refused() -> None:
    with pytest.raises(ClusterInfoError, match="SLURM_DISTRIBUTION='arbitrary'"):
        slurm.detect(step_env(0, SLURM_DISTRIBUTION="arbitrary"))


@pytest.mark.parametrize(
    "counts, distribution, nodes",
    [
        ([2, 2, 2, 1], "block", [0, 0, 1, 1, 2, 2, 3]),
        ([2, 2, 2, 1], "cyclic:block", [0, 1, 2, 3, 0, 1, 2]),
        ([3, 1], "cyclic", [0, 1, 0, 0]),
        ([4, 4], "plane=2", [0, 0, 1, 1, 0, 0, 1, 1]),
        ([2, 1], "", [0, 0, 1]),
    ],
)
def test_task_hosts(counts: list[int], distribution: str, nodes: list[int]) -> None:
    assert task_hosts(counts, distribution) == nodes


def test_heterogeneous_tasks_per_node() -> None:
    """SLURM_TASKS_PER_NODE=2(x3),1: 7 tasks on 4 nodes, task 6 alone on node 3."""
    env = step_env(
        6,
        SLURM_STEP_NODELIST="localhost,127.0.0.[2-4]",
        SLURM_STEP_TASKS_PER_NODE="2(x3),1",
        SLURMD_NODENAME="127.0.0.4",
        SLURM_NODEID="3",
        SLURM_GTIDS="6",
    )
    i = info(env)
    assert i.container_rank == 6
    assert i.container_addrs == ("127.0.0.1",) * 2 + ("127.0.0.2",) * 2 + ("127.0.0.3",) * 2 + (
        "127.0.0.4",
    )


def test_detect_prefers_slurm_over_local() -> None:
    report = detect(node_env(0, SLURM_STEP_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="1"))
    assert report.info.source == "slurm"
    assert [name for name, _ in report.skipped] == ["file", "determined", "torchrun", "mpi"]


def test_gpus_slurm_did_not_allocate_are_not_slots() -> None:
    """A CPU job on a GPU node: SLURM set no GPU variables, so the node's
    device files are not counted (cgroups may forbid them anyway)."""
    assert info(step_env(1)).container_slot_counts == (1, 1, 1, 1)
    assert info(node_env(0, SLURM_JOB_GPUS="0,1")).container_slot_counts == (2, 2)


def test_salloc_shell_off_the_nodes_is_refused() -> None:
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "1"}
    with pytest.raises(ClusterInfoError, match="not on one of the job's nodes.*srun"):
        slurm.detect(env)
