"""Kubernetes: Indexed Jobs / JobSet, and Kubeflow's PyTorchJob.

**Indexed Job or JobSet** (``JOB_COMPLETION_INDEX`` is set by Kubernetes).
A pod knows its index but not its peers, so the manifest names them:

* ``DET_K8S_HOST_PATTERN``: every pod's DNS name, with ``{index}`` for the
  node rank, e.g. ``train-{index}.train`` for an Indexed Job ``train`` whose
  pods use ``subdomain: train`` (a headless Service named ``train`` with
  ``publishNotReadyAddresses: true``). JobSet names pods
  ``<jobset>-<replicatedjob>-<job index>-<pod index>``, so use
  ``{job_index}`` and ``{pod_index}`` there.
* ``DET_K8S_NUM_NODES``: the number of pods (the Job's ``completions``; for
  JobSet, replicas x completions).
* JobSet only: ``DET_K8S_JOB_INDEX`` (from the pod annotation
  ``jobset.sigs.k8s.io/job-index`` via the downward API) and
  ``DET_K8S_PODS_PER_JOB`` (``completions``); the node rank is then
  ``job_index * pods_per_job + JOB_COMPLETION_INDEX``.

Slots per pod: ``DET_LAUNCH_SLOTS``, else the visible GPUs, else 1.

**Kubeflow PyTorchJob** (the training operator sets ``MASTER_ADDR``,
``RANK`` = ``PET_NODE_RANK`` = the pod's rank, ``PET_NNODES`` = pods and
``PET_NPROC_PER_NODE``). Pods are reachable as ``<job>-master-0`` and
``<job>-worker-<i>`` (the operator makes a Service per pod), which is how
the host list is built from ``MASTER_ADDR``; ``DET_K8S_HOST_PATTERN``
overrides it.

Pods start at different times and a pod's DNS name exists only once the pod
does, so names are retried for ``DET_K8S_RESOLVE_TIMEOUT`` seconds (300).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.hostlist import env_int, node_slots, resolve_hosts
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import ClusterInfoError

HOST_PATTERN = "DET_K8S_HOST_PATTERN"
NUM_NODES = "DET_K8S_NUM_NODES"
JOB_INDEX = "DET_K8S_JOB_INDEX"
PODS_PER_JOB = "DET_K8S_PODS_PER_JOB"
RESOLVE_TIMEOUT = "DET_K8S_RESOLVE_TIMEOUT"
DEFAULT_RESOLVE_TIMEOUT_S = 300

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def pod_hosts(pattern: str, num_nodes: int, pods_per_job: int) -> list[str]:
    """Every pod's host name from ``DET_K8S_HOST_PATTERN``."""
    known = {"index", "job_index", "pod_index"}
    for name in _PLACEHOLDER.findall(pattern):
        if name not in known:
            raise ClusterInfoError(
                f"{HOST_PATTERN}={pattern!r}: unknown placeholder {{{name}}} "
                "(use {index}, {job_index}, {pod_index})"
            )
    if "{index}" not in pattern and "{pod_index}" not in pattern:
        raise ClusterInfoError(
            f"{HOST_PATTERN}={pattern!r}: needs {{index}} (or {{job_index}} and {{pod_index}}) "
            "so that every pod gets its own name"
        )
    out = []
    for i in range(num_nodes):
        values = {"index": i, "job_index": i // pods_per_job, "pod_index": i % pods_per_job}
        host = pattern
        for name, value in values.items():
            host = host.replace("{" + name + "}", str(value))
        out.append(host)
    return out


def _resolve_wait(env: Mapping[str, str]) -> float:
    if RESOLVE_TIMEOUT in env:
        return float(env_int(env, RESOLVE_TIMEOUT))
    return float(DEFAULT_RESOLVE_TIMEOUT_S)


def _info(
    env: Mapping[str, str], hosts: list[str], rank: int, slots: int, where: str, source: str
) -> ClusterInfo:
    return ClusterInfo.from_mapping(
        {
            "container_addrs": resolve_hosts(hosts, where, wait_s=_resolve_wait(env)),
            "container_rank": rank,
            "container_slot_counts": [slots] * len(hosts),
        },
        source=source,
        where=where,
    )


class KubernetesIndexedJob(Detector):
    """Pods of an Indexed Job or JobSet (``JOB_COMPLETION_INDEX``)."""

    name = "kubernetes"

    def detect(self, env: Mapping[str, str]) -> Detection:
        if "JOB_COMPLETION_INDEX" not in env:
            return NoMatch("JOB_COMPLETION_INDEX is not set (not a pod of an Indexed Job/JobSet)")
        missing = [v for v in (HOST_PATTERN, NUM_NODES) if not env.get(v)]
        if missing:
            raise ClusterInfoError(
                f"this pod belongs to an Indexed Job (JOB_COMPLETION_INDEX="
                f"{env['JOB_COMPLETION_INDEX']}) but {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set, so it cannot find the other "
                "pods (docs/schedulers.md, Kubernetes); set DET_LAUNCH_DISABLE_DETECTORS="
                "kubernetes to run each pod on its own"
            )
        num_nodes = env_int(env, NUM_NODES, minimum=1)
        pod_index = env_int(env, "JOB_COMPLETION_INDEX")
        if JOB_INDEX in env:
            pods_per_job = env_int(env, PODS_PER_JOB, minimum=1)
            if pod_index >= pods_per_job:
                raise ClusterInfoError(
                    f"JOB_COMPLETION_INDEX={pod_index} is out of range for "
                    f"{PODS_PER_JOB}={pods_per_job}"
                )
            rank = env_int(env, JOB_INDEX) * pods_per_job + pod_index
        else:
            pods_per_job = (
                env_int(env, PODS_PER_JOB, minimum=1) if PODS_PER_JOB in env else num_nodes
            )
            rank = pod_index
        if rank >= num_nodes:
            raise ClusterInfoError(
                f"this pod's node rank {rank} is out of range for {NUM_NODES}={num_nodes}"
            )
        hosts = pod_hosts(env[HOST_PATTERN], num_nodes, pods_per_job)
        return _info(env, hosts, rank, node_slots(env, 1), HOST_PATTERN, self.name)


class KubeflowPyTorchJob(Detector):
    """Pods of a Kubeflow training-operator PyTorchJob."""

    name = "kubeflow"

    def detect(self, env: Mapping[str, str]) -> Detection:
        needed = ("KUBERNETES_SERVICE_HOST", "MASTER_ADDR", "RANK")
        absent = [v for v in needed if v not in env]
        if absent or ("PET_NNODES" not in env and "WORLD_SIZE" not in env):
            return NoMatch(
                f"{', '.join(absent) or 'PET_NNODES/WORLD_SIZE'} not set (not a PyTorchJob pod)"
            )
        nproc_raw = env.get("PET_NPROC_PER_NODE", "")
        nproc = int(nproc_raw) if nproc_raw.isdigit() and int(nproc_raw) > 0 else None
        if "PET_NNODES" in env:
            if ":" in env["PET_NNODES"]:
                raise ClusterInfoError(
                    f"PET_NNODES={env['PET_NNODES']!r}: elastic PyTorchJobs (a node range) are "
                    "not supported; give the job a fixed number of replicas"
                )
            num_nodes = env_int(env, "PET_NNODES", minimum=1)
        else:
            # Operators before PET_NNODES set WORLD_SIZE = pods x nproc_per_node.
            num_nodes = max(1, env_int(env, "WORLD_SIZE", minimum=1) // (nproc or 1))
        rank_var = "PET_NODE_RANK" if "PET_NODE_RANK" in env else "RANK"
        rank = env_int(env, rank_var)
        if rank >= num_nodes:
            raise ClusterInfoError(f"{rank_var}={rank} is out of range for {num_nodes} pods")

        if env.get(HOST_PATTERN):
            hosts = pod_hosts(env[HOST_PATTERN], num_nodes, num_nodes)
            where = HOST_PATTERN
        else:
            hosts = self._operator_hosts(env["MASTER_ADDR"], num_nodes)
            where = f"PyTorchJob pods (MASTER_ADDR={env['MASTER_ADDR']})"
        slots = nproc or node_slots(env, 1)
        return _info(env, hosts, rank, slots, where, self.name)

    @staticmethod
    def _operator_hosts(master: str, num_nodes: int) -> list[str]:
        """The training operator's per-pod Service names, rank order."""
        m = re.fullmatch(r"(.+)-(master|worker)-0", master)
        if not m:
            raise ClusterInfoError(
                f"MASTER_ADDR={master!r} is not a PyTorchJob pod name (<job>-master-0 or "
                f"<job>-worker-0); set {HOST_PATTERN} to name the pods"
            )
        job, first = m.group(1), m.group(2)
        if first == "master":
            return [master] + [f"{job}-worker-{i}" for i in range(num_nodes - 1)]
        return [f"{job}-worker-{i}" for i in range(num_nodes)]
