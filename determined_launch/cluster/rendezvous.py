"""``det.RendezvousInfo`` and ``det.ResourcesInfo``: Determined's plain records
of where a container sits and which GPUs it has, for code that builds or
reads them by hand. Our own detectors produce ``ClusterInfo`` directly."""

from __future__ import annotations

from typing import Any


class RendezvousInfo:
    """Machine identity: every node's address, this node's rank, slots per node."""

    def __init__(self, container_addrs: list[str], container_rank: int,
                 container_slot_counts: list[int]) -> None:
        self.container_addrs = list(container_addrs)
        self.container_rank = container_rank
        self.container_slot_counts = list(container_slot_counts)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, RendezvousInfo) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"RendezvousInfo({vars(self)})"


class ResourcesInfo:
    """The GPUs of this container, by UUID."""

    def __init__(self, gpu_uuids: list[str]) -> None:
        self._gpu_uuids = list(gpu_uuids)

    @property
    def gpu_uuids(self) -> list[str]:
        return self._gpu_uuids

    def __repr__(self) -> str:
        return f"ResourcesInfo(gpu_uuids={self._gpu_uuids})"
