"""``LaunchPlan``: what a backend wants run, as data.

Backends never start processes. They turn ``ClusterInfo`` (where am I), a
``JobRuntime`` (the impure choices made once at launch: job directory, ports,
secret) and the user's arguments into a ``LaunchPlan``, and ``supervise``
runs it. Keeping the builders pure is what lets every command line be unit
tested without starting anything.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping
from typing import Optional

from determined_launch.common.redact import redact_text, secret_key


@dataclasses.dataclass(frozen=True)
class FileToWrite:
    """A file the plan needs on disk before its command starts (hostfiles,
    env files). Written atomically with ``mode`` inside the job directory."""

    path: str
    content: str
    mode: int = 0o600


@dataclasses.dataclass(frozen=True)
class BackendArgs:
    """The user's command line for a backend entry point:
    ``[OVERRIDES... --] SCRIPT...``."""

    #: Arguments for the backend's own launcher (torchrun, horovodrun, deepspeed).
    overrides: tuple[str, ...]
    #: The user's command; never empty.
    script: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class JobRuntime:
    """Per-launch choices, made by the entry point before any builder runs.

    ``job_dir`` is a fresh 0700 directory private to this job on this node.
    ``secret`` authenticates launcher control traffic and DistributedContext
    messages (``None`` only when the user explicitly runs without one).
    """

    job_dir: str
    master_port: int
    control_port: int
    dist_port: int
    secret: Optional[str]
    #: Interpreter for ``-m`` entry points (``sys.executable`` at launch).
    python: str
    #: The workers' ``PYTHONPATH`` (``compat.worker_pythonpath``); ``None``: inherited.
    pythonpath: Optional[str] = None

    # Fixed names inside the private job directory: the directory itself is
    # unique per job, so these never collide between jobs.
    @property
    def cluster_info_file(self) -> str:
        return os.path.join(self.job_dir, "cluster-info.json")

    @property
    def ipc_dir(self) -> str:
        return os.path.join(self.job_dir, "ipc")

    @property
    def status_dir(self) -> str:
        return os.path.join(self.job_dir, "exit-status")

    @property
    def preempt_signal_file(self) -> str:
        return os.path.join(self.job_dir, "preempt-requested")

    @property
    def preempt_ack_file(self) -> str:
        return os.path.join(self.job_dir, "preempt-acknowledged")

    @property
    def preempt_listen_file(self) -> str:
        return os.path.join(self.job_dir, "preempt-listening")

    @property
    def tool_log(self) -> str:
        """The framework launchers' own output (not their workers')."""
        return os.path.join(self.job_dir, "launcher-tools.log")


def render_env(env: Mapping[str, str]) -> str:
    """``K=V`` pairs for display; secrets are masked because dry runs end up in logs."""
    return " ".join(  # the project's one rule (common/redact.py): keys, then URLs in values
        f"{k}={'<secret>' if secret_key(k) else shlex.quote(redact_text(v))}"
        for k, v in sorted(env.items())
    )


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """One process of a plan.

    ``role`` decides how its end is read:

    * ``"worker"``: does the job's work; the node is done when every worker
      has exited, and a non-zero exit fails the whole job (on every node).
    * ``"service"``: supports the workers (an sshd, a rendezvous server) and
      runs until they are done; ``supervise`` then stops it. A service that
      exits early fails the job. A node whose plan has only services (a
      non-chief node in ssh mode) is done when the chief's job ends.

    ``tool`` marks a framework launcher (torchrun, horovodrun, deepspeed)
    whose children are the workers: signals meant for the job go to its
    workers, and a stop kills it outright once they have their TERM (its
    own teardown adds about a second and a traceback, nothing more).
    """

    argv: tuple[str, ...]
    name: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    role: str = "worker"
    tool: bool = False

    def render(self) -> str:
        return f"{render_env(self.env)} {shlex.join(self.argv)}".strip()


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """What ``supervise`` runs on this node.

    ``env`` is applied on top of the launcher's own environment for every
    process; ``unset_env`` names variables to remove (for example a parent
    torchrun's ``RANK`` that must not leak into a nested launch).
    """

    processes: tuple[ProcessSpec, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    files: tuple[FileToWrite, ...] = ()
    unset_env: tuple[str, ...] = ()
    #: Human-readable backend name for logs and the exit summary.
    name: str = "job"
    #: Glob patterns of files this job's tools are known to leave behind
    #: (DeepSpeed's shared-memory buffers); removed once every process the
    #: plan started is gone. Specific to this job (its port), never broader.
    leftovers: tuple[str, ...] = ()

    def render(self) -> str:
        """The plan as shell lines, for ``--dry-run`` and error messages."""
        lines = [f"# {self.name}: common environment: {render_env(self.env)}"]
        lines += [f"{p.render()}    # {p.name} ({p.role})" for p in self.processes]
        return "\n".join(lines)
