"""IBM Spectrum LSF: ``LSB_DJOB_RANKFILE`` or ``LSB_MCPU_HOSTS``.

LSF gives every task of a job the same host list: ``LSB_DJOB_RANKFILE``
names a file with one host per slot, ``LSB_MCPU_HOSTS`` reads
``"hostA 4 hostB 4"``. Nodes are ranked in list order and each node finds
itself by host name. Slots per node: ``DET_LAUNCH_SLOTS``, else the visible
GPUs, else the node's LSF slot count.

Start one launcher per host, for example
``blaunch -z "$(echo $LSB_HOSTS | tr ' ' '\\n' | sort -u)" python -m ...``
(docs/schedulers.md); a launcher started only in the batch script would wait
for nodes that never join.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Optional

from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.hostlist import host_list_info, read_node_file
from determined_launch.errors import ClusterInfoError


def parse_mcpu_hosts(text: str) -> list[str]:
    """``"hostA 2 hostB 1"`` -> ``["hostA", "hostA", "hostB"]``."""
    fields = text.split()
    if not fields or len(fields) % 2:
        raise ClusterInfoError(f"LSB_MCPU_HOSTS={text!r}: expected pairs of host and slot count")
    out: list[str] = []
    for host, count in zip(fields[::2], fields[1::2]):
        if not count.isdigit() or int(count) < 1:
            raise ClusterInfoError(f"LSB_MCPU_HOSTS={text!r}: bad slot count {count!r} for {host}")
        out.extend([host] * int(count))
    return out


class Lsf(Detector):
    """Tasks of an LSF job (``LSB_JOBID``)."""

    name = "lsf"

    def __init__(self, hostname: Optional[str] = None) -> None:
        self.hostname = hostname

    def detect(self, env: Mapping[str, str]) -> Detection:
        if "LSB_JOBID" not in env:
            return NoMatch("LSB_JOBID is not set (not inside an LSF job)")
        if env.get("LSB_DJOB_RANKFILE"):
            hosts = read_node_file(env["LSB_DJOB_RANKFILE"], "LSB_DJOB_RANKFILE")
            where = f"LSB_DJOB_RANKFILE={env['LSB_DJOB_RANKFILE']}"
        elif env.get("LSB_MCPU_HOSTS"):
            hosts = parse_mcpu_hosts(env["LSB_MCPU_HOSTS"])
            where = "LSB_MCPU_HOSTS"
        else:
            raise ClusterInfoError(
                f"LSF job {env['LSB_JOBID']}: neither LSB_DJOB_RANKFILE nor LSB_MCPU_HOSTS is set"
            )
        return host_list_info(
            env, hosts, self.hostname or socket.gethostname(), where=where, source=self.name
        )
