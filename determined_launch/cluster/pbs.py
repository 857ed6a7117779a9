"""PBS Pro / OpenPBS / Torque: ``PBS_NODEFILE``.

The node file lists one host per slot (``mpiprocs``); nodes are ranked in
order of first appearance and each node finds itself by host name. Slots
per node: ``DET_LAUNCH_SLOTS``, else the visible GPUs, else the node's line
count. Start one launcher per node, e.g. ``pbsdsh -u python -m ...``
(docs/schedulers.md).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Optional

from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.hostlist import host_list_info, read_node_file


class Pbs(Detector):
    """Tasks of a PBS job (``PBS_JOBID`` and ``PBS_NODEFILE``)."""

    name = "pbs"

    def __init__(self, hostname: Optional[str] = None) -> None:
        self.hostname = hostname

    def detect(self, env: Mapping[str, str]) -> Detection:
        if "PBS_JOBID" not in env or not env.get("PBS_NODEFILE"):
            return NoMatch("PBS_JOBID and PBS_NODEFILE are not both set (not inside a PBS job)")
        path = env["PBS_NODEFILE"]
        hosts = read_node_file(path, "PBS_NODEFILE")
        return host_list_info(
            env,
            hosts,
            self.hostname or socket.gethostname(),
            where=f"PBS_NODEFILE={path}",
            source=self.name,
        )
