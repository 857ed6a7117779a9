"""determined_launch: Determined AI's distributed launch layer, for any cluster.

The public face mirrors ``import determined as det`` for the Core API
tutorials: ``det.get_cluster_info()`` (``None`` in local mode, as Determined's
off-cluster), ``det.ClusterInfo``, ``det.core``, ``det.generic`` (seed 000's
Generic API) and ``det.LOG_FORMAT``.

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
    from determined_launch import core, errors, generic, pytorch
    from determined_launch._user import InvalidHP, import_from_path
    from determined_launch.core import DistributedContext, DistributedError
    from determined_launch.launch.launcher import launch_per_slot
    from determined_launch.pytorch._units import Batches, Epochs

    __version__: str

from determined_launch._user import LOG_FORMAT, package_version

#: attribute -> the module that defines it (or is it)
_LAZY = {
    "core": "determined_launch.core",
    # Seed 000's Generic API, a layer over the Core API (no torch).
    "generic": "determined_launch.generic",
    "DistributedContext": "determined_launch.core",
    "DistributedError": "determined_launch.core",
    "launch_per_slot": "determined_launch.launch.launcher",
    # The PyTorch Trial/Trainer API imports torch, so only on first use.
    "pytorch": "determined_launch.pytorch",
    "Epochs": "determined_launch.pytorch._units",
    "Batches": "determined_launch.pytorch._units",
    "InvalidHP": "determined_launch._user",
    "import_from_path": "determined_launch._user",
    "errors": "determined_launch.errors",
    # Determined's test helpers call det._DistributedBackend() (spec 2.13).
    "_DistributedBackend": "determined_launch.core._dummy",
    # Test-compat: what Determined's own unit tests and their helpers import
    # (docs/pytorch.md, "Determined's own tests"); LegacyTrial/TrialController import torch.
    "gpu": "determined_launch.gpu",
    "workload": "determined_launch.workload",
    "common": "determined_launch.common",
    "experimental": "determined_launch.experimental",
    "EnvContext": "determined_launch._testcompat",
    "LegacyTrial": "determined_launch._testcompat",
    "TrialController": "determined_launch._testcompat",
    "_make_local_execution_env": "determined_launch._testcompat",
    "_local_execution_manager": "determined_launch._testcompat",
    "_catch_sys_exit": "determined_launch._testcompat",
}



def __getattr__(name: str) -> Any:
    if name == "__version__":  # read on use: importlib.metadata costs ~10 ms at import
        return package_version()
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'determined_launch' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    return module if module_name.endswith("." + name) else getattr(module, name)


__all__ = [
    "__version__",
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
    "generic",
    "get_cluster_info",
    "import_from_path",
    "launch_per_slot",
    "pytorch",
]
