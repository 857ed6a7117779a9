"""What one generation of a job runs with: its private job directory, ports and secret.

Everything impure a plan depends on is decided here, once per generation
(``--max-restarts``), into a ``JobRuntime``; the backend's builder stays a
pure function of it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import secrets
import socket
import sys
import tempfile
from collections.abc import Mapping

from determined_launch import envvars
from determined_launch.backends.plan import JobRuntime
from determined_launch.cluster.info import ClusterInfo
from determined_launch.compat import worker_pythonpath
from determined_launch.errors import LaunchError
from determined_launch.launch.generations import generation_ports, generation_secret
from determined_launch.supervisor import write_private_file

#: torchrun's and Determined's default master port, used for multi-node jobs.
DEFAULT_C10D_PORT = 29400


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_ports_free(info: ClusterInfo, runtime: JobRuntime) -> None:
    """On the chief, fail fast when a port the job will listen on is taken.

    torch would otherwise die with an ``EADDRINUSE`` traceback from every
    worker. This is a check, not a reservation: the port is released again
    at once, because torchrun and the control channel bind it themselves.
    Ports a single-node job picked itself are fresh and are not checked.
    """
    if not info.is_chief:
        return
    what = (
        (runtime.master_port, "torch's master port"),
        (runtime.control_port, "the launchers' control channel"),
        (runtime.dist_port, "DistributedContext"),
    )
    for port, purpose in what:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    continue
                raise LaunchError(
                    f"port {port} ({purpose}) is already in use on this host; set "
                    f"{envvars.C10D_PORT} to a free port (the job uses {envvars.C10D_PORT}, "
                    f"+1 and +2), or unset it on a single node to pick free ports"
                ) from None


def _ports(info: ClusterInfo, env: Mapping[str, str], generation: int = 0) -> tuple[int, int, int]:
    """(master, control, dist) ports.

    Multi-node jobs need ports every node can compute without talking first,
    so they are ``C10D_PORT`` (default 29400) and the next two. A single
    node picks free ports unless ``C10D_PORT`` is set, so two jobs on one
    machine never collide. A later generation (``--max-restarts``) moves
    all three (``generation_ports``): an old one's frozen chief may still hold
    its ports on a host the next chief shares.
    """
    raw = env.get(envvars.C10D_PORT)
    if raw:
        if not raw.isdigit() or not 1024 <= int(raw) <= 65533:
            raise LaunchError(
                f"environment variable {envvars.C10D_PORT}: expected a port in 1024-65533, "
                f"got {raw!r}"
            )
        return generation_ports(int(raw), generation)
    if info.single_node:
        return _free_port(), _free_port(), _free_port()
    return generation_ports(DEFAULT_C10D_PORT, generation)


def job_secret(info: ClusterInfo, env: Mapping[str, str]) -> str:
    """The secret that authenticates launcher and DistributedContext traffic.

    ``DET_DIST_SECRET`` wins, then the cluster info's ``job_secret``. A
    single-node job makes a fresh one (nothing else needs to know it). A
    multi-node job without one cannot agree on a secret without a trusted
    channel, so it falls back to a key every node can derive from the
    cluster info, with a warning: that keeps jobs from talking to each other
    by accident but does not stop an attacker on the network.
    """
    secret = env.get(envvars.DIST_SECRET) or info.job_secret
    if secret:
        return secret
    if info.single_node:
        return secrets.token_hex(32)
    print(
        f"det-launch: WARNING: no job secret for a multi-node job; set {envvars.DIST_SECRET} "
        "(same value on every node) or 'job_secret' in the cluster info file. Using a key "
        "derived from the cluster info, which does not authenticate against network attackers.",
        file=sys.stderr,
    )
    basis = json.dumps(
        [list(info.container_addrs), list(info.container_slot_counts), env.get("SLURM_JOB_ID")]
    )
    return hashlib.sha256(basis.encode()).hexdigest()


def make_runtime(
    info: ClusterInfo, env: Mapping[str, str], determined_compat: bool = True,
    generation: int = 0, members: tuple[int, ...] = (),
) -> JobRuntime:
    """Create the private job directory and decide ports, secret and the
    workers' ``PYTHONPATH``. Each generation (``--max-restarts``) gets its
    own directory and secret (and fresh ports on a single node); ``members``:
    its nodes (original ranks) when ``--min-nodes`` changed them, bound into
    the secret too."""
    job_dir = tempfile.mkdtemp(prefix="det-launch-")  # mode 0700, unique per job
    master, control, dist = _ports(info, env, generation)
    runtime = JobRuntime(
        job_dir=job_dir,
        master_port=master,
        control_port=control,
        dist_port=dist,
        secret=generation_secret(job_secret(info, env), generation, members),
        python=sys.executable,
        pythonpath=worker_pythonpath(env, determined_compat),
    )
    write_private_file(runtime.cluster_info_file, json.dumps(info.to_file_dict(), indent=2))
    return runtime
