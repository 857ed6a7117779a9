"""The detector contract: one small class per place a job can run.

A detector looks only at the environment mapping it is given (and files that
environment names), so every detector is unit-testable with a recorded
environment. It answers in one of three ways:

* a ``ClusterInfo``: the markers of its cluster are present and valid;
* ``NoMatch(reason)``: its markers are absent; ``det-launch info`` prints the
  reason so users can see why an earlier detector was skipped;
* raises ``ClusterInfoError``: its markers are present but wrong. This stops
  the launcher (exit status 2) rather than silently falling through to a
  later detector and launching a job of the wrong shape.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Union

from determined_launch.cluster.info import ClusterInfo


@dataclasses.dataclass(frozen=True)
class NoMatch:
    """This detector's cluster is not the one we are running on, and why."""

    reason: str


Detection = Union[ClusterInfo, NoMatch]


class Detector(abc.ABC):
    """Base class for cluster environments. Subclasses set ``name``."""

    #: Short, lowercase, used by ``--detector`` / ``DET_LAUNCH_DETECTOR``.
    name: ClassVar[str]

    @abc.abstractmethod
    def detect(self, env: Mapping[str, str]) -> Detection:
        """Return this node's ``ClusterInfo``, or ``NoMatch`` saying why not."""
