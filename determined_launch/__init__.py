"""determined_launch: Determined AI's distributed launch layer, for any cluster.

The public face mirrors ``import determined as det`` for the Core API
tutorials: ``det.get_cluster_info()``, ``det.ClusterInfo``, ``det.core`` and
``det.LOG_FORMAT``.

Heavier parts (the launcher with psutil, the ZeroMQ context) load on first
use, so small ``python -m determined_launch.X`` helpers that run in front of
every worker start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from determined_launch.cluster import ClusterInfo, TrialInfo, get_cluster_info
from determined_launch.cluster.rendezvous import RendezvousInfo, ResourcesInfo

if TYPE_CHECKING:
    from determined_launch import core, errors, pytorch
    from determined_launch._user import InvalidHP, import_from_path
    from determined_launch.core import DistributedContext, DistributedError
    from determined_launch.launcher import launch_per_slot
    from determined_launch.pytorch._units import Batches, Epochs

from determined_launch._user import LOG_FORMAT

#: attribute -> the module that defines it (or is it)
_LAZY = {
    "core": "determined_launch.core",
    "DistributedContext": "determined_launch.core",
    "DistributedError": "determined_launch.core",
    "launch_per_slot": "determined_launch.launcher",
    # The PyTorch Trial/Trainer API imports torch, so only on first use.
    "pytorch": "determined_launch.pytorch",
    "Epochs": "determined_launch.pytorch._units",
    "Batches": "determined_launch.pytorch._units",
    "InvalidHP": "determined_launch._user",
    "import_from_path": "determined_launch._user",
    "errors": "determined_launch.errors",
    # Determined's test helpers call det._DistributedBackend() (spec 2.13).
    "_DistributedBackend": "determined_launch.core._dummy",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'determined_launch' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    return module if module_name.endswith("." + name) else getattr(module, name)


__all__ = [
    "LOG_FORMAT",
    "Batches",
    "ClusterInfo",
    "RendezvousInfo",
    "ResourcesInfo",
    "DistributedContext",
    "DistributedError",
    "Epochs",
    "InvalidHP",
    "TrialInfo",
    "core",
    "errors",
    "get_cluster_info",
    "import_from_path",
    "launch_per_slot",
    "pytorch",
]
