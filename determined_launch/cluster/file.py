"""``DET_CLUSTER_INFO_FILE``: an explicit JSON file, the most direct source."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from determined_launch import envvars
from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.hostlist import resolve_hosts
from determined_launch.cluster.info import ClusterInfo

ENV_VAR = envvars.CLUSTER_INFO_FILE


class ClusterInfoFile(Detector):
    """Reads the file named by ``DET_CLUSTER_INFO_FILE``.

    Schema (README, "Cluster info file"): ``container_addrs``,
    ``container_rank``, ``container_slot_counts``, and optionally ``slot_ids``,
    ``trial`` (``trial_id``, ``hparams``, ``trial_seed``, ``max_length``),
    ``latest_checkpoint`` and ``job_secret``.
    """

    name = "file"

    def detect(self, env: Mapping[str, str]) -> Detection:
        path = env.get(ENV_VAR)
        if not path:
            return NoMatch(f"{ENV_VAR} is not set")
        info = ClusterInfo.from_json_file(path, source=self.name)
        if info.single_node:
            return info  # nothing connects to another node by name
        # Resolved once, up front, as the scheduler detectors do: a host no
        # node can find fails here by name, not as a rendezvous timeout.
        addrs = resolve_hosts(info.container_addrs, f"cluster info file {path}: container_addrs")
        return dataclasses.replace(info, container_addrs=tuple(addrs))
