"""determined_launch: Determined AI's distributed launch layer, for any cluster.

The public face mirrors ``import determined as det`` for the Core API
tutorials: ``det.get_cluster_info()``, ``det.ClusterInfo``, ``det.core`` and
``det.LOG_FORMAT``.
"""

from determined_launch.cluster import ClusterInfo, TrialInfo, get_cluster_info
from determined_launch.core import DistributedContext, DistributedError
from determined_launch.launcher import launch_per_slot

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

__all__ = [
    "LOG_FORMAT",
    "ClusterInfo",
    "DistributedContext",
    "DistributedError",
    "TrialInfo",
    "get_cluster_info",
    "launch_per_slot",
]
