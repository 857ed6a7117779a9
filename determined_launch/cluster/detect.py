"""The ordered list of detectors and the one function that walks it.

Order matters: explicit beats implicit. The cluster-info file is an explicit
request; Determined's files come next because inside a Determined task they
are authoritative; scheduler environments follow; the local default always
matches, so ``detect`` always returns something.

To add a cluster environment, write one ``Detector`` subclass in its own
module and add an instance to ``DETECTORS`` before ``LocalMachine``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Optional

from determined_launch.cluster.base import Detector, NoMatch
from determined_launch.cluster.determined import DeterminedInfoDir
from determined_launch.cluster.file import ClusterInfoFile
from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.local import LocalMachine
from determined_launch.errors import ClusterInfoError

#: Use only this detector (by name); it must match.
FORCE_ENV = "DET_LAUNCH_DETECTOR"
#: Comma-separated detector names to skip.
DISABLE_ENV = "DET_LAUNCH_DISABLE_DETECTORS"

DETECTORS: Sequence[Detector] = (
    ClusterInfoFile(),
    DeterminedInfoDir(),
    LocalMachine(),
)


@dataclasses.dataclass(frozen=True)
class DetectionReport:
    """What matched, and why each detector before it did not."""

    info: ClusterInfo
    skipped: tuple[tuple[str, str], ...]  # (detector name, reason)


def detector_names() -> list[str]:
    return [d.name for d in DETECTORS]


def _split_names(raw: Optional[str]) -> list[str]:
    return [n.strip() for n in (raw or "").split(",") if n.strip()]


def _check_names(names: Sequence[str], where: str) -> None:
    known = detector_names()
    for n in names:
        if n not in known:
            raise ClusterInfoError(f"{where}: unknown detector {n!r} (known: {', '.join(known)})")


def detect(
    env: Optional[Mapping[str, str]] = None,
    *,
    force: Optional[str] = None,
    disable: Sequence[str] = (),
) -> DetectionReport:
    """Find this node's ``ClusterInfo``.

    ``force`` and ``disable`` come from CLI flags; the environment variables
    ``DET_LAUNCH_DETECTOR`` and ``DET_LAUNCH_DISABLE_DETECTORS`` apply when
    the flags are not given. Raises ``ClusterInfoError`` for broken inputs.
    """
    env = os.environ if env is None else env
    force = force or env.get(FORCE_ENV) or None
    disabled = list(disable) or _split_names(env.get(DISABLE_ENV))
    if force:
        _check_names([force], f"--detector / {FORCE_ENV}")
    _check_names(disabled, f"--disable-detector / {DISABLE_ENV}")

    skipped: list[tuple[str, str]] = []
    for detector in DETECTORS:
        if force and detector.name != force:
            continue
        if detector.name in disabled:
            skipped.append((detector.name, "disabled"))
            continue
        result = detector.detect(env)
        if isinstance(result, NoMatch):
            if force:
                raise ClusterInfoError(
                    f"detector {force!r} was forced but does not match: {result.reason}"
                )
            skipped.append((detector.name, result.reason))
            continue
        return DetectionReport(info=result, skipped=tuple(skipped))
    raise ClusterInfoError("no detector matched (the 'local' detector is disabled)")


def get_cluster_info(env: Optional[Mapping[str, str]] = None) -> ClusterInfo:
    """The seed's ``det.get_cluster_info()``: this node's rendezvous info.

    Unlike Determined's, it never returns ``None``: off-cluster it describes
    the local machine, so seed code that reads ``info.trial`` or
    ``info.latest_checkpoint`` keeps working (both are ``None`` there).
    """
    return detect(env).info
