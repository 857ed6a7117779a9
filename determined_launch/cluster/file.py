"""``DET_CLUSTER_INFO_FILE``: an explicit JSON file, the most direct source."""

from __future__ import annotations

from collections.abc import Mapping

from determined_launch import envvars
from determined_launch.cluster.base import Detection, Detector, NoMatch
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
        return ClusterInfo.from_json_file(path, source=self.name)
