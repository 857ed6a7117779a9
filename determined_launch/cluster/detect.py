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
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from determined_launch import envvars
from determined_launch.cluster.base import Detector, NoMatch
from determined_launch.cluster.determined import DeterminedInfoDir
from determined_launch.cluster.file import ClusterInfoFile
from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.kubernetes import KubeflowPyTorchJob, KubernetesIndexedJob
from determined_launch.cluster.local import LocalMachine
from determined_launch.cluster.local_trial import complete
from determined_launch.cluster.lsf import Lsf
from determined_launch.cluster.mpi import Mpi
from determined_launch.cluster.pbs import Pbs
from determined_launch.cluster.slurm import Slurm
from determined_launch.cluster.torchrun_env import TorchrunEnv
from determined_launch.errors import ClusterInfoError

#: Use only this detector (by name); it must match. Comma-separated detector names to skip.
#: (Declared with every other launcher option in launch/config.py; read here for callers
#: that pass no flags.)
FORCE_ENV, DISABLE_ENV = envvars.DETECTOR, envvars.DISABLE_DETECTORS

# Scheduler order: the innermost launcher wins. A torchrun worker inside an
# srun step is a torchrun worker; mpirun inside a SLURM, PBS or LSF job sets
# its own variables on top of the scheduler's inherited ones.
DETECTORS: Sequence[Detector] = (
    ClusterInfoFile(),
    DeterminedInfoDir(),
    TorchrunEnv(),
    Mpi(),
    Slurm(),
    Lsf(),
    Pbs(),
    KubeflowPyTorchJob(),
    KubernetesIndexedJob(),
    LocalMachine(),
)


@dataclasses.dataclass(frozen=True)
class DetectionReport:
    """What matched, and why each detector before it did not."""

    info: ClusterInfo
    skipped: tuple[tuple[str, str], ...]  # (detector name, reason)
    #: the detector that matched (``info.source`` is what a cluster-info file says)
    detector: str = ""


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
        return DetectionReport(info=result, skipped=tuple(skipped), detector=detector.name)
    raise ClusterInfoError("no detector matched (the 'local' detector is disabled)")


_said: set[str] = set()


def _say_once(message: str) -> None:
    """One line per process: ``core.init()`` asks for the info again."""
    if message not in _said:
        _said.add(message)
        print(f"det_launch: {message}", file=sys.stderr, flush=True)


def resolve_cluster_info(
    env: Optional[Mapping[str, str]] = None,
    commit_check: Optional[Callable[[Mapping[str, str], Any], Callable[[str], bool]]] = None,
) -> ClusterInfo:
    """This node's info, always: the detected one, or the local machine, with
    the local trial and the run directory's newest checkpoint when no scheduler
    or launcher named them (``local_trial.py``). What ``core.init()`` and
    ``pytorch.init()`` run on, on a cluster or not. ``commit_check(env,
    checkpoint_storage)``: the commit-marker check for object storage (from
    ``core.storage``, which this layer may not import), so that a bare process
    resumes from the newest *committed* checkpoint as a launcher's workers do."""
    env = os.environ if env is None else env
    info = detect(env).info
    check = commit_check(env, info.checkpoint_storage) if commit_check is not None else None
    return complete(info, env, say=_say_once, is_committed=check)


#: Launchers that are neither ours nor a scheduler: their workers without our
#: cluster-info file are in local mode, as they are in Determined.
_FOREIGN_LAUNCHERS = (TorchrunEnv.name, Mpi.name)


def local_mode(env: Optional[Mapping[str, str]] = None) -> bool:
    """Determined's local mode: no launcher of ours (its workers read a
    cluster-info file), no Determined task, no scheduler. A bare
    ``torchrun`` or ``mpirun`` counts as bare; one inside a scheduler's job
    does not."""
    env = os.environ if env is None else env
    force = env.get(FORCE_ENV)
    if force:
        return force == LocalMachine.name
    disabled = _split_names(env.get(DISABLE_ENV))
    if LocalMachine.name in disabled:
        return False  # the user asked never to run as the local machine
    report = detect(env, disable=[*disabled, *_FOREIGN_LAUNCHERS])
    return report.detector == LocalMachine.name


def get_cluster_info(env: Optional[Mapping[str, str]] = None) -> Optional[ClusterInfo]:
    """The seed's ``det.get_cluster_info()``: this node's rendezvous info, or
    ``None`` in local mode (``local_mode``), as Determined's off-cluster.

    Under any ``det-launch`` command or a scheduler the info has a ``trial``
    (the local trial when nothing named one) and ``latest_checkpoint``, so the
    tutorials' ``info.trial.trial_id`` and ``info.latest_checkpoint`` work as on
    a cluster. ``core.init()`` works in both (``resolve_cluster_info``).
    """
    env = os.environ if env is None else env
    if local_mode(env):
        return None
    return resolve_cluster_info(env)


def explain(report: DetectionReport) -> str:
    """``det-launch info``: which detector matched, why each one before it
    did not, and the resolved information as JSON (the secret masked)."""
    info = report.info
    width = max([len(d.name) for d in DETECTORS])
    lines = [f"detector: {info.source}"]
    if report.skipped:
        lines.append("tried first:")
        lines += [f"  {name:<{width}}  {reason}" for name, reason in report.skipped]
    lines.append(
        f"this node: rank {info.container_rank} of {info.num_nodes} "
        f"(chief {info.chief_ip}), {info.slots_per_node} slot(s) here, "
        f"{info.total_slots} in total"
    )
    lines.append(json.dumps(info.to_dict(), indent=2, sort_keys=True))
    return "\n".join(lines)
