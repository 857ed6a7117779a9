"""SLURM: run the launcher inside an ``srun`` step, no cluster-info file.

Two ways to start it, both supported:

* **One launcher per node** (recommended): ``srun --ntasks-per-node=1``.
  Each node is one container; the launcher starts one worker per slot.
  Slots per node, first that applies: ``DET_LAUNCH_SLOTS``;
  ``SLURM_GPUS_ON_NODE``; the number of ``SLURM_STEP_GPUS``; the GPUs in
  ``CUDA_VISIBLE_DEVICES``; else 1 (the step's one task; in the batch script
  of a one-node job, that node's ``SLURM_TASKS_PER_NODE``). GPU counts are read
  on this node and assumed equal on every node, because SLURM tells a task
  only about its own node's GPUs.

* **One task per slot**: srun started several tasks on a node (plain
  ``srun`` in a batch script with ``--ntasks-per-node=4``). Then every task
  is its own one-slot container, ``container_rank = SLURM_PROCID``: the
  launcher in each task starts exactly one worker, nothing is launched twice
  and the world size is the step's task count. Each such worker has
  ``LOCAL_RANK=0``, so each task must see only its own GPU (``--gpus-per-task=1``);
  a task that sees several GPUs is refused, with the fix in the message.

A launcher started in the batch script itself (or an ``salloc`` shell) of a
multi-node job, outside any ``srun`` step, is refused: only the first node
runs the batch script, so the other nodes would never join.

Node names become addresses through SLURM's own ``NodeAddr`` (``scontrol
show node``, how SLURM itself reaches the node) and then the system resolver.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Callable, Optional

from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.hostlist import (
    env_int,
    expand_hostlist,
    node_slots,
    parse_task_counts,
    resolve_hosts,
)
from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.local import count_visible_gpus
from determined_launch.errors import ClusterInfoError

SCONTROL_TIMEOUT_S = 15.0

NodeAddrs = Callable[[list[str]], Mapping[str, str]]

_LAUNCH_HINT = "srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES python -m ..."


def scontrol_node_addrs(names: list[str]) -> dict[str, str]:
    """``NodeAddr`` of SLURM nodes, as ``scontrol show node`` reports it.

    SLURM itself reaches a node at its ``NodeAddr``; sites (and our test
    cluster) may name nodes ``n1``, ``n2`` and give their addresses only in
    ``slurm.conf``. Empty when scontrol is unavailable: then names go to DNS.
    """
    if shutil.which("scontrol") is None:
        return {}
    try:
        r = subprocess.run(
            ["scontrol", "show", "node", "--oneliner", ",".join(names)],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[str, str] = {}
    for line in r.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in shlex.split(line) if "=" in f)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            out[fields["NodeName"]] = fields["NodeAddr"]
    return out


def task_hosts(
    counts: Sequence[int], distribution: str, where: str = "SLURM_DISTRIBUTION"
) -> list[int]:
    """The node index of every task of a step, by global task id.

    SLURM places tasks by ``SLURM_DISTRIBUTION``'s first field: ``block``
    (fill node 0, then node 1, ...), ``cyclic`` (one task per node in turn)
    or ``plane=N`` (N tasks per node in turn). ``counts`` is tasks per node.
    """
    kind = (distribution or "block").split(":")[0].split(",")[0]
    if kind in ("block", "unknown", ""):
        return [node for node, c in enumerate(counts) for _ in range(c)]
    if kind == "cyclic":
        chunk = 1
    elif kind.startswith("plane="):
        chunk = int(kind.split("=", 1)[1])
    else:
        raise ClusterInfoError(
            f"{where}={distribution!r}: cannot tell which node runs which task; "
            "use -m block or cyclic, or run one launcher per node (--ntasks-per-node=1)"
        )
    left = list(counts)
    out: list[int] = []
    while any(left):
        for node in range(len(left)):
            take = min(chunk, left[node])
            out.extend([node] * take)
            left[node] -= take
    return out


def slurm_gpus(env: Mapping[str, str]) -> int:
    """GPUs SLURM gave this task: ``CUDA_VISIBLE_DEVICES`` when set (SLURM
    narrows it per task with ``--gpus-per-task``), else the step's GPUs on
    this node. 0 when SLURM allocated none: device files on a GPU node say
    nothing then (cgroups may forbid them)."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return count_visible_gpus(env)
    if env.get("SLURM_GPUS_ON_NODE", "").strip():
        return env_int(env, "SLURM_GPUS_ON_NODE")
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if env.get(var, "").strip():
            return len([g for g in env[var].split(",") if g.strip()])
    return 0


class Slurm(Detector):
    """``srun`` steps (``SLURM_JOB_ID`` plus the step's node list)."""

    name = "slurm"

    def __init__(self, node_addrs: Optional[NodeAddrs] = scontrol_node_addrs) -> None:
        #: Node name -> NodeAddr lookup (tests pass a recorded table).
        self.node_addrs = node_addrs

    def detect(self, env: Mapping[str, str]) -> Detection:
        if "SLURM_JOB_ID" not in env:
            return NoMatch("SLURM_JOB_ID is not set (not inside a SLURM job)")
        in_step = "SLURM_STEP_ID" in env and "SLURM_STEP_NODELIST" in env
        nodelist_var = "SLURM_STEP_NODELIST" if in_step else "SLURM_JOB_NODELIST"
        if nodelist_var not in env:
            raise ClusterInfoError(f"SLURM job {env['SLURM_JOB_ID']}: {nodelist_var} is not set")
        nodes = expand_hostlist(env[nodelist_var], nodelist_var)
        if not in_step and "SLURMD_NODENAME" not in env and "SLURM_NODEID" not in env:
            raise ClusterInfoError(
                f"SLURM job {env['SLURM_JOB_ID']}: this shell is not on one of the job's nodes "
                f"(an salloc shell?); start the launcher with srun: {_LAUNCH_HINT}"
            )
        if not in_step and len(nodes) > 1:
            raise ClusterInfoError(
                f"the launcher runs in the batch script (or salloc shell) of a "
                f"{len(nodes)}-node SLURM job, outside any srun step, so only one node would "
                f"start; run it in a step on every node: {_LAUNCH_HINT}"
            )

        tasks_var = "SLURM_STEP_TASKS_PER_NODE" if in_step else "SLURM_TASKS_PER_NODE"
        if tasks_var in env:
            tasks = parse_task_counts(env[tasks_var], tasks_var)
        else:
            tasks = [1] * len(nodes)
        if len(tasks) != len(nodes):
            raise ClusterInfoError(
                f"{tasks_var}={env[tasks_var]!r} describes {len(tasks)} nodes but "
                f"{nodelist_var} names {len(nodes)}"
            )
        node_index = self._node_index(env, nodes)

        if in_step and max(tasks) > 1:
            hosts, rank, slots = self._one_task_per_slot(env, nodes, tasks, node_index)
        else:
            # One launcher per node. Outside a step (a one-node batch script)
            # the job's tasks on this node are the slots the user asked for.
            hosts, rank = nodes, node_index
            slots = [self._node_slots(env, default=tasks[node_index])] * len(nodes)

        # SLURM reaches its nodes at NodeAddr, which may differ from the node
        # name (and the name may not be in DNS at all).
        node_addr = self.node_addrs(sorted(set(hosts))) if self.node_addrs else {}
        addrs = resolve_hosts([node_addr.get(h, h) for h in hosts], nodelist_var)
        return ClusterInfo.from_mapping(
            {"container_addrs": addrs, "container_rank": rank, "container_slot_counts": slots},
            source=self.name,
            where=f"SLURM job {env['SLURM_JOB_ID']}",
        )

    @staticmethod
    def _node_index(env: Mapping[str, str], nodes: Sequence[str]) -> int:
        """This node's position in the step's node list: by ``SLURMD_NODENAME``
        (unambiguous), else ``SLURM_NODEID``."""
        name = env.get("SLURMD_NODENAME")
        if name is not None and name in nodes:
            return nodes.index(name)
        index = env_int(env, "SLURM_NODEID")
        if index >= len(nodes):
            raise ClusterInfoError(
                f"SLURM_NODEID={index} is out of range for a node list of {len(nodes)} nodes"
            )
        return index

    @staticmethod
    def _node_slots(env: Mapping[str, str], default: int) -> int:
        return node_slots(env, default, slurm_gpus(env), count_devices=False)

    @staticmethod
    def _one_task_per_slot(
        env: Mapping[str, str], nodes: Sequence[str], tasks: Sequence[int], node_index: int
    ) -> tuple[list[str], int, list[int]]:
        """Every task is a one-slot container; see the module docstring."""
        procid = env_int(env, "SLURM_PROCID")
        on_this_node = tasks[node_index]
        gpus = slurm_gpus(env)
        if gpus > 1:
            raise ClusterInfoError(
                f"srun started {on_this_node} tasks on node {nodes[node_index]} and this task "
                f"sees {gpus} GPUs; either run one launcher per node ({_LAUNCH_HINT}), which "
                "starts one worker per GPU, or give each task its own GPU (--gpus-per-task=1)"
            )
        node_of_task = task_hosts(tasks, env.get("SLURM_DISTRIBUTION", "block"))
        if procid >= len(node_of_task) or node_of_task[procid] != node_index:
            raise ClusterInfoError(
                f"SLURM_PROCID={procid} is not on node {nodes[node_index]} under "
                f"SLURM_DISTRIBUTION={env.get('SLURM_DISTRIBUTION', 'block')!r}; run one "
                f"launcher per node instead ({_LAUNCH_HINT})"
            )
        gtids = env.get("SLURM_GTIDS")
        if gtids:
            expected = [t for t, n in enumerate(node_of_task) if n == node_index]
            if [int(t) for t in gtids.split(",")] != expected:
                raise ClusterInfoError(
                    f"SLURM_GTIDS={gtids} does not match the task layout computed from "
                    f"SLURM_DISTRIBUTION; run one launcher per node instead ({_LAUNCH_HINT})"
                )
        return [nodes[n] for n in node_of_task], procid, [1] * len(node_of_task)
