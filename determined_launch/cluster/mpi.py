"""``mpirun`` / ``mpiexec``: Open MPI (``OMPI_COMM_WORLD_*``) and
PMI-based MPIs (MPICH, Intel MPI: ``PMI_RANK``, ``PMI_SIZE``,
``MPI_LOCALNRANKS``).

Every MPI process is one container, ``container_rank`` = its MPI rank:

* ``mpirun --map-by ppr:1:node`` (one process per node): the launcher in each
  starts one worker per slot (``DET_LAUNCH_SLOTS``, else the visible GPUs,
  else 1);
* ``mpirun -np <slots>`` (one process per slot): each process is a one-slot
  container and its launcher starts exactly one worker, so nothing is
  launched twice. Such a process must not see several GPUs (its worker has
  ``LOCAL_RANK=0``); it is refused with the fix in the message.

MPI does not put the other ranks' hosts in the environment. When every rank
runs on this host (``*_LOCAL_SIZE`` equals the world size) all addresses are
loopback. Across hosts, each rank's host name is exchanged with mpi4py's
``allgather`` in a short-lived child process (it joins the MPI job as this
rank, so the launcher itself never initializes MPI); without mpi4py the
detector says so and stops.

PMI variables that ``srun --mpi=pmi2`` sets for its own tasks describe the
same step as SLURM's variables; then the SLURM detector answers instead.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Callable, Optional

from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.hostlist import env_int, node_slots, resolve_hosts
from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.local import count_visible_gpus
from determined_launch.errors import ClusterInfoError

GATHER_TIMEOUT_S = 120.0
_GATHER = (
    "import json, socket\n"
    "from mpi4py import MPI\n"
    "print(json.dumps(MPI.COMM_WORLD.allgather(socket.gethostname())))\n"
)

#: Returns every rank's host name in rank order, or None when it cannot.
HostGather = Callable[[Mapping[str, str]], Optional[list[str]]]


def mpi4py_hostnames(env: Mapping[str, str]) -> Optional[list[str]]:
    """Every rank's host name via mpi4py, run in a child process."""
    if importlib.util.find_spec("mpi4py") is None:
        return None
    try:
        r = subprocess.run(
            [sys.executable, "-c", _GATHER],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=GATHER_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ClusterInfoError(
            f"mpi4py allgather of host names did not finish in {GATHER_TIMEOUT_S:.0f}s "
            "(did every rank start the launcher?)"
        ) from None
    if r.returncode:
        tail = r.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ClusterInfoError(f"mpi4py allgather of host names failed: {tail[0]}")
    hosts = json.loads(r.stdout.strip().splitlines()[-1])
    return [str(h) for h in hosts]


class Mpi(Detector):
    """Processes started by mpirun/mpiexec."""

    name = "mpi"

    def __init__(self, gather: HostGather = mpi4py_hostnames) -> None:
        self.gather = gather

    def detect(self, env: Mapping[str, str]) -> Detection:
        if "OMPI_COMM_WORLD_SIZE" in env:
            prefix = "OMPI_COMM_WORLD_"
            rank = env_int(env, "OMPI_COMM_WORLD_RANK")
            size = env_int(env, "OMPI_COMM_WORLD_SIZE", minimum=1)
            local_size = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1)
        elif "PMI_RANK" in env and "PMI_SIZE" in env:
            prefix = "PMI_"
            rank = env_int(env, "PMI_RANK")
            size = env_int(env, "PMI_SIZE", minimum=1)
            if (
                "SLURM_STEP_ID" in env
                and env.get("SLURM_PROCID") == str(rank)
                and env.get("SLURM_STEP_NUM_TASKS") == str(size)
            ):
                return NoMatch(
                    "PMI_* were set by srun for its own tasks (the slurm detector reads them)"
                )
            local_var = next((v for v in ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE") if v in env), None)
            local_size = env_int(env, local_var, minimum=1) if local_var else 0
        else:
            return NoMatch("neither OMPI_COMM_WORLD_SIZE nor PMI_RANK/PMI_SIZE is set")
        if rank >= size:
            raise ClusterInfoError(f"{prefix}RANK={rank} is out of range for a world of {size}")

        if size == 1 or local_size == size:
            hosts = ["127.0.0.1"] * size
        else:
            gathered = self.gather(env)
            if gathered is None:
                raise ClusterInfoError(
                    f"mpirun started {size} processes on several hosts, and MPI does not tell a "
                    "process where the others run; install mpi4py (the launcher exchanges host "
                    "names with it), or start one launcher per node with srun, pbsdsh or blaunch"
                )
            if len(gathered) != size:
                raise ClusterInfoError(
                    f"mpi4py returned {len(gathered)} host names for {size} ranks"
                )
            hosts = gathered

        # The same answer on every rank: one process per host means one
        # launcher per node; otherwise every process is a one-slot container.
        if len(set(hosts)) == size:
            slots = [node_slots(env, 1)] * size
        else:
            gpus = count_visible_gpus(env)
            if gpus > 1:
                raise ClusterInfoError(
                    f"mpirun started {hosts.count(hosts[rank])} processes on this host and each "
                    f"sees {gpus} GPUs; start one process per node (mpirun --map-by ppr:1:node), "
                    "which launches one worker per GPU, or give each process one GPU"
                )
            slots = [1] * size
        return ClusterInfo.from_mapping(
            {
                "container_addrs": resolve_hosts(hosts, "mpirun host names"),
                "container_rank": rank,
                "container_slot_counts": slots,
            },
            source=self.name,
            where=f"MPI rank {rank} of {size}",
        )
