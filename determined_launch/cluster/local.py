"""The fallback: one node on loopback, for laptops and single machines."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping

from determined_launch import values
from determined_launch.cluster.base import Detection, Detector
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import ClusterInfoError

#: Number of local worker slots; ``--slots N`` on the CLI sets it too.
SLOTS_ENV = "DET_LAUNCH_SLOTS"


def count_visible_gpus(env: Mapping[str, str]) -> int:
    """GPUs this process may use, without importing torch (which costs ~1 s).

    ``CUDA_VISIBLE_DEVICES`` wins when set (an empty value means none);
    otherwise we count NVIDIA device nodes.
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])


class LocalMachine(Detector):
    """Always matches: a single node on 127.0.0.1.

    Slots, in order: ``DET_LAUNCH_SLOTS``; the number of visible GPUs; 1.
    """

    name = "local"

    def detect(self, env: Mapping[str, str]) -> Detection:
        raw = env.get(SLOTS_ENV)
        if raw is not None and raw.strip():
            try:
                slots = values.integer(raw, minimum=1, maximum=values.MAX_SLOTS_PER_NODE)
            except ValueError as e:
                raise ClusterInfoError(f"environment variable {SLOTS_ENV}: {e}") from None
        else:
            slots = count_visible_gpus(env) or 1
        return ClusterInfo.from_mapping(
            {
                "container_addrs": ["127.0.0.1"],
                "container_rank": 0,
                "container_slot_counts": [slots],
            },
            source=self.name,
            where=f"local default ({os.uname().nodename})",
        )
