"""Where am I: rendezvous information from files or the scheduler's environment."""

from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.detect import (
    DETECTORS,
    DetectionReport,
    detect,
    get_cluster_info,
    local_mode,
    resolve_cluster_info,
)
from determined_launch.cluster.info import ClusterInfo, TrialInfo

__all__ = [
    "DETECTORS",
    "ClusterInfo",
    "Detection",
    "DetectionReport",
    "Detector",
    "NoMatch",
    "TrialInfo",
    "detect",
    "get_cluster_info",
    "local_mode",
    "resolve_cluster_info",
]
