"""MPI, torchrun, LSF, PBS and Kubernetes detectors, and `det-launch info`'s
explanation. Environments were recorded from the real tools where this
machine has them (Open MPI 4.1.4, torchrun 2.13); LSF, PBS and Kubernetes
environments follow those tools' documentation (none of them runs here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from determined_launch.cluster import ClusterInfo, detect
from determined_launch.cluster.base import NoMatch
from determined_launch.cluster.detect import explain
from determined_launch.cluster.kubernetes import (
    KubeflowPyTorchJob,
    KubernetesIndexedJob,
    pod_hosts,
)
from determined_launch.cluster.lsf import Lsf, parse_mcpu_hosts
from determined_launch.cluster.mpi import Mpi
from determined_launch.cluster.pbs import Pbs
from determined_launch.cluster.torchrun_env import TorchrunEnv, refuse_nested_launch
from determined_launch.errors import ClusterInfoError, LaunchError

REPO = Path(__file__).resolve().parent.parent


def matched(result: object) -> ClusterInfo:
    assert isinstance(result, ClusterInfo), result
    return result


# --- torchrun ---------------------------------------------------------------

TORCHRUN_RANK1 = {  # recorded: torchrun --nproc_per_node=2, worker 1
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "localhost",
    "MASTER_PORT": "38477",
    "RANK": "1",
    "ROLE_RANK": "1",
    "ROLE_WORLD_SIZE": "2",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "28a5a356-6c16-454b-9d7c-b95b296a5f57",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "WORLD_SIZE": "2",
}


def test_torchrun_single_node_describes_the_job_and_launchers_refuse() -> None:
    info = matched(TorchrunEnv().detect(TORCHRUN_RANK1))
    assert (info.container_addrs, info.container_slot_counts) == (("127.0.0.1",), (2,))
    assert info.source == "torchrun"
    with pytest.raises(LaunchError, match="already inside a torchrun worker.*RANK=1"):
        refuse_nested_launch(info, TORCHRUN_RANK1)
    refuse_nested_launch(matched(detect({}).info), {})  # local: no objection


def test_torchrun_multi_node_cannot_name_the_other_nodes() -> None:
    env = {**TORCHRUN_RANK1, "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "4", "GROUP_RANK": "1"}
    with pytest.raises(ClusterInfoError, match="spans several nodes"):
        TorchrunEnv().detect(env)


def test_legacy_launchers_without_run_id_are_recognised() -> None:
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    assert matched(TorchrunEnv().detect(env)).total_slots == 1


def test_our_own_workers_are_answered_by_the_file_first(tmp_path: Path) -> None:
    f = tmp_path / "info.json"
    f.write_text(
        json.dumps(
            {"container_addrs": ["127.0.0.1"], "container_rank": 0, "container_slot_counts": [2]}
        )
    )
    report = detect({**TORCHRUN_RANK1, "DET_CLUSTER_INFO_FILE": str(f)})
    assert report.info.source == "file"


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_detect_inside_a_real_torchrun() -> None:
    code = "from determined_launch.cluster import detect; print(detect().info.source)"
    r = subprocess.run(
        ["torchrun", "--nproc_per_node=1", "--no-python", sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["torchrun"]


# --- MPI --------------------------------------------------------------------


def ompi_env(rank: int, size: int, local_size: int, **extra: str) -> dict[str, str]:
    """Recorded from `mpirun -np 2` (Open MPI 4.1.4), trimmed."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(rank % local_size),
        "OMPI_MCA_orte_num_nodes": str(size // local_size),
        "OMPI_MCA_orte_hnp_uri": "1237843968.0;tcp://192.0.2.2:49073",
        "PMIX_RANK": str(rank),
        **extra,
    }


def no_mpi4py(env: object) -> None:
    return None


def test_mpi_one_host_one_process_per_slot() -> None:
    info = matched(Mpi(gather=no_mpi4py).detect(ompi_env(1, 2, 2)))
    assert info.container_addrs == ("127.0.0.1", "127.0.0.1")
    assert (info.container_rank, info.container_slot_counts) == (1, (1, 1))


def test_mpi_refuses_processes_that_share_gpus() -> None:
    with pytest.raises(ClusterInfoError, match="each sees 2 GPUs.*ppr:1:node"):
        Mpi(gather=no_mpi4py).detect(ompi_env(0, 2, 2, CUDA_VISIBLE_DEVICES="0,1"))


def test_mpi_across_hosts_needs_mpi4py() -> None:
    with pytest.raises(ClusterInfoError, match="install mpi4py"):
        Mpi(gather=no_mpi4py).detect(ompi_env(1, 2, 1))


def test_mpi_across_hosts_with_gathered_names() -> None:
    hosts = ["localhost", "127.0.0.2"]
    per_node = Mpi(gather=lambda env: hosts).detect(ompi_env(1, 2, 1, DET_LAUNCH_SLOTS="3"))
    info = matched(per_node)
    assert info.container_addrs == ("127.0.0.1", "127.0.0.2")
    assert (info.container_rank, info.container_slot_counts) == (1, (3, 3))
    per_slot = matched(Mpi(gather=lambda env: hosts * 2).detect(ompi_env(3, 4, 2)))
    assert per_slot.container_slot_counts == (1, 1, 1, 1)


def test_mpich_hydra_and_srun_pmi() -> None:
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2", "PMI_FD": "5"}
    assert matched(Mpi(gather=no_mpi4py).detect(hydra)).container_rank == 1
    srun_pmi2 = {**hydra, "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"}
    result = Mpi(gather=no_mpi4py).detect(srun_pmi2)
    assert isinstance(result, NoMatch) and "slurm detector" in result.reason


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) is not installed")
def test_detect_under_a_real_mpirun() -> None:
    code = (
        "import json; from determined_launch.cluster import detect; i = detect().info; "
        "print(json.dumps([i.source, i.container_rank, i.container_addrs, "
        "i.container_slot_counts]))"
    )
    r = subprocess.run(
        [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            "-x",
            f"PYTHONPATH={REPO}",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    # mpirun forwards both ranks' stdout through one pipe and may join their lines,
    # so read consecutive JSON documents rather than one per line
    rows, text, decoder = [], r.stdout.strip(), json.JSONDecoder()
    while text:
        row, end = decoder.raw_decode(text)
        rows.append(row)
        text = text[end:].lstrip()
    rows.sort()
    assert rows == [
        ["mpi", 0, ["127.0.0.1", "127.0.0.1"], [1, 1]],
        ["mpi", 1, ["127.0.0.1", "127.0.0.1"], [1, 1]],
    ]


# --- LSF and PBS ----------------------------------------------------------


def test_lsf_rankfile(tmp_path: Path) -> None:
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("localhost\nlocalhost\n127.0.0.2\n127.0.0.2\n")
    env = {"LSB_JOBID": "42", "LSB_DJOB_RANKFILE": str(rankfile)}
    info = matched(Lsf(hostname="127.0.0.2").detect(env))
    assert info.container_addrs == ("127.0.0.1", "127.0.0.2")
    assert (info.container_rank, info.container_slot_counts) == (1, (2, 2))
    gpus = matched(Lsf(hostname="localhost").detect({**env, "CUDA_VISIBLE_DEVICES": "0"}))
    assert gpus.container_slot_counts == (1, 1)


def test_lsf_mcpu_hosts() -> None:
    env = {"LSB_JOBID": "42", "LSB_MCPU_HOSTS": "localhost 4 127.0.0.2 2"}
    info = matched(Lsf(hostname="localhost").detect(env))
    assert (info.container_rank, info.container_slot_counts) == (0, (4, 2))
    assert parse_mcpu_hosts("a 2 b 1") == ["a", "a", "b"]
    with pytest.raises(ClusterInfoError, match="pairs of host and slot count"):
        parse_mcpu_hosts("a 2 b")


def test_lsf_host_not_in_the_job(tmp_path: Path) -> None:
    env = {"LSB_JOBID": "42", "LSB_MCPU_HOSTS": "localhost 4"}
    with pytest.raises(ClusterInfoError, match="this host 'elsewhere' is not in"):
        Lsf(hostname="elsewhere").detect(env)


def test_pbs_nodefile(tmp_path: Path) -> None:
    nodefile = tmp_path / "aaa.pbs"
    nodefile.write_text("localhost\nlocalhost\nlocalhost\n127.0.0.3\n")
    env = {"PBS_JOBID": "7.server", "PBS_NODEFILE": str(nodefile)}
    info = matched(Pbs(hostname="127.0.0.3").detect(env))
    assert info.container_addrs == ("127.0.0.1", "127.0.0.3")
    assert (info.container_rank, info.container_slot_counts) == (1, (3, 1))
    missing = {"PBS_JOBID": "7.server", "PBS_NODEFILE": str(tmp_path / "gone")}
    with pytest.raises(ClusterInfoError, match="PBS_NODEFILE=.*gone: cannot read"):
        Pbs(hostname="x").detect(missing)


# --- Kubernetes -------------------------------------------------------------

K8S = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "DET_K8S_RESOLVE_TIMEOUT": "0"}


def test_indexed_job() -> None:
    # Addresses stand in for the pods' DNS names, which only exist in a cluster.
    env = {
        **K8S,
        "JOB_COMPLETION_INDEX": "1",
        "DET_K8S_HOST_PATTERN": "127.0.1.{index}",
        "DET_K8S_NUM_NODES": "3",
        "DET_LAUNCH_SLOTS": "2",
    }
    info = matched(KubernetesIndexedJob().detect(env))
    assert info.container_addrs == ("127.0.1.0", "127.0.1.1", "127.0.1.2")
    assert (info.container_rank, info.container_slot_counts) == (1, (2, 2, 2))


def test_indexed_job_without_the_pattern_is_refused() -> None:
    with pytest.raises(ClusterInfoError, match="DET_K8S_HOST_PATTERN and DET_K8S_NUM_NODES"):
        KubernetesIndexedJob().detect({**K8S, "JOB_COMPLETION_INDEX": "0"})


def test_jobset_ranks_and_names() -> None:
    assert pod_hosts("js-w-{job_index}-{pod_index}.js", 4, 2) == [
        "js-w-0-0.js",
        "js-w-0-1.js",
        "js-w-1-0.js",
        "js-w-1-1.js",
    ]
    env = {
        **K8S,
        "JOB_COMPLETION_INDEX": "1",
        "DET_K8S_JOB_INDEX": "1",
        "DET_K8S_PODS_PER_JOB": "2",
        "DET_K8S_NUM_NODES": "4",
        "DET_K8S_HOST_PATTERN": "127.0.2.{index}",
    }
    assert matched(KubernetesIndexedJob().detect(env)).container_rank == 3
    with pytest.raises(ClusterInfoError, match="unknown placeholder"):
        pod_hosts("pod-{rank}", 2, 2)


def test_pod_dns_names_that_never_appear_are_named() -> None:
    env = {
        **K8S,
        "JOB_COMPLETION_INDEX": "0",
        "DET_K8S_NUM_NODES": "2",
        "DET_K8S_HOST_PATTERN": "train-{index}.train.invalid",
    }
    with pytest.raises(ClusterInfoError, match="cannot resolve host 'train-0.train.invalid'"):
        KubernetesIndexedJob().detect(env)


def kubeflow_env(rtype: str, index: int, replicas: int, nproc: str = "1") -> dict[str, str]:
    """What the training operator's setPodEnv gives a PyTorchJob pod
    (Master + Workers); MASTER_ADDR is the master's Service name."""
    rank = index + 1 if rtype == "worker" else index
    n = int(nproc) if nproc.isdigit() else 1
    return {
        **K8S,
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": str(replicas * n),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NNODES": str(replicas),
        "PYTHONUNBUFFERED": "0",
    }


def test_kubeflow_pytorchjob() -> None:
    env = {**kubeflow_env("worker", 0, 2, nproc="4"), "DET_K8S_HOST_PATTERN": "127.0.3.{index}"}
    info = matched(KubeflowPyTorchJob().detect(env))
    assert info.container_addrs == ("127.0.3.0", "127.0.3.1")
    assert (info.container_rank, info.container_slot_counts) == (1, (4, 4))
    assert KubeflowPyTorchJob._operator_hosts("pt-master-0", 3) == [
        "pt-master-0",
        "pt-worker-0",
        "pt-worker-1",
    ]
    assert KubeflowPyTorchJob._operator_hosts("pt-worker-0", 2) == ["pt-worker-0", "pt-worker-1"]
    with pytest.raises(ClusterInfoError, match="not a PyTorchJob pod name"):
        KubeflowPyTorchJob().detect(kubeflow_env("master", 0, 2))


def test_kubeflow_elastic_is_refused() -> None:
    env = {**kubeflow_env("master", 0, 1), "PET_NNODES": "1:3"}
    with pytest.raises(ClusterInfoError, match="elastic"):
        KubeflowPyTorchJob().detect(env)


# --- det-launch info ------------------------------------------------------


def test_explain_names_the_match_and_every_skipped_detector() -> None:
    text = explain(detect({"DET_LAUNCH_DISABLE_DETECTORS": "mpi"}))
    assert text.splitlines()[0] == "detector: local"
    assert "  mpi         disabled" in text
    assert "slurm       SLURM_JOB_ID is not set" in text
    doc = json.loads(text[text.index("{") :])
    assert doc["container_addrs"] == ["127.0.0.1"] and doc["source"] == "local"


def test_forcing_a_detector_that_does_not_match() -> None:
    with pytest.raises(ClusterInfoError, match="'slurm' was forced but does not match"):
        detect({"DET_LAUNCH_DETECTOR": "slurm"})
