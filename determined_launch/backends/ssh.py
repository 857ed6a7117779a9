"""Everything the ssh modes need, as data: keys, sshd and client configs, argv.

Horovod's and DeepSpeed's multi-node launchers reach the other nodes over
ssh. Determined gets there by having its master hand every container the
same key pair. We have no master, but every node of a job knows the job
secret, so each node *derives* the same keys from it (``ssh_keys.py``,
through ``cryptography``, the ``[ssh]`` extra). No file is copied between
nodes, and the builders stay pure functions of their inputs (but for the
random check bytes OpenSSH's private key format carries). Whoever holds the
job secret can already run code in the workers (it authenticates
DistributedContext traffic), so the derived login key grants nothing new;
ssh modes therefore refuse to run with a secret that was itself derived from
public information.

Layout, all inside the node's private 0700 job directory:

* ``sshd_config``, ``ssh_host_ed25519_key`` and ``ssh_authorized_keys``
  for the node's sshd (a "service" process, ``determined_launch.nodeexec.sshd``);
* ``ssh_client_key``, ``ssh_config``, ``ssh_known_hosts`` and an ``ssh``
  wrapper script, put first on ``PATH`` for horovodrun and pdsh, so the
  launchers' plain ``ssh host ...`` uses this job's key and *verifies* the
  peers' host keys (horovodrun passes ``StrictHostKeyChecking=no``; the
  wrapper's earlier ``yes`` wins, because ssh keeps the first value);
* ``node-env.json``: the node-local worker variables (job directory paths)
  and the job secret. Workers started through sshd find it through
  ``SetEnv`` in sshd_config and load it with ``determined_launch.nodeexec.gate``;
  so the secret never appears on a command line, where horovodrun and pdsh
  would put every exported variable.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from typing import Optional

from determined_launch import envvars, values
from determined_launch.backends.plan import FileToWrite, JobRuntime, ProcessSpec
from determined_launch.backends.ssh_keys import derive_key
from determined_launch.cluster.info import ClusterInfo
from determined_launch.errors import LaunchError

SSH_PORT_ENV = envvars.SSH_PORT
DEFAULT_SSH_PORT = 12350  # Determined's
SSH_MODE_ENV = envvars.SSH_MODE
CONNECT_TIMEOUT_ENV = envvars.CONNECT_TIMEOUT
DEFAULT_CONNECT_TIMEOUT = 300.0
SSHD_NODE_ENV = envvars.SSHD_NODE_ENV
NODE_ENV_FILE = envvars.NODE_ENV_FILE

#: Worker variables whose values differ between nodes (paths in the job
#: directory) or must stay off command lines: the gate restores them.
NODE_LOCAL_VARS = frozenset(
    {
        envvars.JOB_DIR,
        envvars.CLUSTER_INFO_FILE,
        envvars.DIST_IPC_DIR,
        envvars.PREEMPT_SIGNAL_FILE,
        envvars.PREEMPT_ACK_FILE,
        envvars.WRAP_RANK_STATUS_DIR,
        envvars.DIST_SECRET,
        NODE_ENV_FILE,
        SSHD_NODE_ENV,
    }
)


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """What a builder may know about this machine, gathered once.

    Builders take this as an argument (tests pass their own), which keeps
    them pure; ``current()`` is what the entry points use.
    """

    environ: Mapping[str, str]
    #: ``mpirun`` on PATH: horovodrun may choose MPI, otherwise we pass --gloo.
    mpirun: bool = False
    ssh: Optional[str] = None
    sshd: Optional[str] = None
    user: str = "root"
    uid: int = 0

    @classmethod
    def current(cls) -> HostFacts:
        sshd = shutil.which("sshd") or next(
            (p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(p, os.X_OK)),
            None,
        )
        return cls(
            environ=dict(os.environ),
            mpirun=shutil.which("mpirun") is not None,
            ssh=shutil.which("ssh"),
            sshd=os.path.abspath(sshd) if sshd else None,
            user=getpass.getuser(),
            uid=os.getuid(),
        )


def pop_mode_flags(overrides: Sequence[str], environ: Mapping[str, str]) -> tuple[bool, list[str]]:
    """Take ``--ssh``/``--no-ssh`` (ours) out of the backend's overrides.

    Returns (use ssh for multi-node, remaining overrides). The flag wins over
    ``DET_LAUNCH_SSH``; without either, multi-node jobs run ssh-free.
    """
    use_ssh = _bool_env(environ, SSH_MODE_ENV)
    rest = []
    for arg in overrides:
        if arg == "--ssh":
            use_ssh = True
        elif arg == "--no-ssh":
            use_ssh = False
        else:
            rest.append(arg)
    return use_ssh, rest


def _bool_env(environ: Mapping[str, str], name: str) -> bool:
    raw = environ.get(name, "").strip()
    try:
        return values.boolean(raw) if raw else False
    except ValueError as e:
        raise LaunchError(f"environment variable {name}: {e}") from None


def ssh_port(environ: Mapping[str, str]) -> int:
    raw = environ.get(SSH_PORT_ENV, "").strip()
    if not raw:
        return DEFAULT_SSH_PORT
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise LaunchError(f"environment variable {SSH_PORT_ENV}: expected a port, got {raw!r}")
    return int(raw)


def connect_timeout(environ: Mapping[str, str]) -> float:
    raw = environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        return values.seconds(raw, positive=True)
    except ValueError as e:
        raise LaunchError(f"environment variable {CONNECT_TIMEOUT_ENV}: {e}") from None


# ------------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True)
class SshLayout:
    """Paths of the ssh files in one node's job directory."""

    job_dir: str

    def _p(self, name: str) -> str:
        return os.path.join(self.job_dir, name)

    @property
    def sshd_config(self) -> str:
        return self._p("sshd_config")

    @property
    def host_key(self) -> str:
        return self._p("ssh_host_ed25519_key")

    @property
    def authorized_keys(self) -> str:
        return self._p("ssh_authorized_keys")

    @property
    def client_key(self) -> str:
        return self._p("ssh_client_key")

    @property
    def client_config(self) -> str:
        return self._p("ssh_config")

    @property
    def known_hosts(self) -> str:
        return self._p("ssh_known_hosts")

    @property
    def wrapper(self) -> str:
        """The ``ssh`` found first on PATH by horovodrun and pdsh."""
        return self._p("ssh")

    @property
    def node_env(self) -> str:
        return self._p("node-env.json")


def require_real_secret(info: ClusterInfo, facts: HostFacts, what: str) -> None:
    """ssh keys derived from a guessable secret would let anyone log in."""
    if not (facts.environ.get(envvars.DIST_SECRET) or info.job_secret):
        raise LaunchError(
            f"{what} over ssh needs a job secret: set {envvars.DIST_SECRET} (the same value on "
            "every node) or 'job_secret' in the cluster info file; the login keys are derived "
            "from it"
        )


def node_env(env: Mapping[str, str]) -> dict[str, str]:
    """The node-local part of a worker environment, for ``node-env.json``."""
    return {k: v for k, v in env.items() if k in NODE_LOCAL_VARS}


def node_env_file(runtime: JobRuntime, env: Mapping[str, str]) -> FileToWrite:
    layout = SshLayout(runtime.job_dir)
    payload = dict(node_env(env))
    payload[NODE_ENV_FILE] = layout.node_env
    return FileToWrite(layout.node_env, json.dumps(payload, indent=1, sort_keys=True) + "\n")


def sshd_files(
    info: ClusterInfo, runtime: JobRuntime, facts: HostFacts, port: int
) -> tuple[FileToWrite, ...]:
    """This node's sshd: host key, the job's client key as the only login,
    and a config that allows nothing but running commands."""
    if runtime.secret is None:
        raise LaunchError("ssh mode needs a job secret")
    layout = SshLayout(runtime.job_dir)
    host = derive_key(runtime.secret, "host")
    client = derive_key(runtime.secret, "client")
    config = f"""\
# sshd for one det-launch job on node {info.container_rank} (generated).
Port {port}
HostKey {layout.host_key}
AuthorizedKeysFile {layout.authorized_keys}
AllowUsers {facts.user}
PidFile none
# Only this job's key; no passwords, no PAM.
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
PermitRootLogin prohibit-password
UsePAM no
# The key files live in the private job directory, which is below a
# world-writable /tmp; StrictModes would reject that path although the
# files themselves are 0600 in a 0700 directory made by this process.
StrictModes no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
PermitUserEnvironment no
PrintMotd no
PrintLastLog no
LogLevel ERROR
LoginGraceTime 60
# horovodrun opens one connection per remote worker at once.
MaxStartups 1024
# Workers started through this sshd find their node's job directory here.
SetEnv {SSHD_NODE_ENV}={layout.node_env}
"""
    return (
        FileToWrite(layout.sshd_config, config),
        FileToWrite(layout.host_key, host.private_file),
        FileToWrite(layout.authorized_keys, f"restrict {client.public_line}\n"),
    )


def sshd_process(
    info: ClusterInfo, runtime: JobRuntime, facts: HostFacts, port: int
) -> ProcessSpec:
    if not facts.sshd:
        raise LaunchError(
            "ssh mode needs an OpenSSH server (sshd) on every node; install openssh-server "
            "or run without --ssh"
        )
    addr = info.container_addrs[info.container_rank]
    argv = (
        runtime.python,
        "-m",
        "determined_launch.nodeexec.sshd",
        "--sshd",
        facts.sshd,
        "--config",
        SshLayout(runtime.job_dir).sshd_config,
        "--addr",
        addr,
        "--port",
        str(port),
    )
    return ProcessSpec(argv=argv, name=f"sshd on {addr}:{port}", role="service")


def client_files(
    info: ClusterInfo, runtime: JobRuntime, facts: HostFacts, port: int
) -> tuple[FileToWrite, ...]:
    """The chief's ssh client setup: key, config, pinned host keys, wrapper."""
    if runtime.secret is None:
        raise LaunchError("ssh mode needs a job secret")
    if not facts.ssh:
        raise LaunchError("ssh mode needs the OpenSSH client (ssh) on the chief")
    layout = SshLayout(runtime.job_dir)
    client = derive_key(runtime.secret, "client")
    host = derive_key(runtime.secret, "host")
    # known_hosts names hosts on port 22 bare, on other ports as "[host]:port".
    patterns = ",".join(
        a if port == 22 else f"[{a}]:{port}" for a in dict.fromkeys(info.container_addrs)
    )
    config = f"""\
# ssh client settings for one det-launch job (generated).
Host *
  Port {port}
  IdentityFile {layout.client_key}
  IdentitiesOnly yes
  UserKnownHostsFile {layout.known_hosts}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  CheckHostIP no
  PasswordAuthentication no
  KbdInteractiveAuthentication no
  BatchMode yes
  LogLevel ERROR
  ConnectTimeout 30
  ServerAliveInterval 15
  ServerAliveCountMax 4
"""
    wrapper = f"""\
#!/bin/sh
# ssh with this det-launch job's key, settings and pinned host keys (generated).
exec {shlex.quote(facts.ssh)} -F {shlex.quote(layout.client_config)} \\
    -o StrictHostKeyChecking=yes "$@"
"""
    return (
        FileToWrite(layout.client_key, client.private_file),
        FileToWrite(layout.client_config, config),
        FileToWrite(layout.known_hosts, f"{patterns} {host.public_key}\n"),
        FileToWrite(layout.wrapper, wrapper, mode=0o700),
    )


def client_path(runtime: JobRuntime, environ: Mapping[str, str]) -> str:
    """``PATH`` with the job directory (and its ``ssh`` wrapper) first."""
    rest = environ.get("PATH", os.defpath)
    return f"{runtime.job_dir}{os.pathsep}{rest}" if rest else runtime.job_dir


def gate_argv(
    runtime: JobRuntime,
    *,
    node_env: bool = False,
    wait_tcp: Sequence[str] = (),
    wait_ssh: Sequence[str] = (),
    timeout: Optional[float] = None,
    gloo_iface_for: Optional[str] = None,
) -> list[str]:
    """``python -m determined_launch.nodeexec.gate ... --``: checks, then exec."""
    argv = [runtime.python, "-m", "determined_launch.nodeexec.gate"]
    if node_env:
        argv.append("--node-env")
    for endpoint in wait_tcp:
        argv += ["--wait-tcp", endpoint]
    for endpoint in wait_ssh:
        argv += ["--wait-ssh", endpoint]
    if timeout is not None:
        argv += ["--timeout", f"{timeout:g}"]
    if gloo_iface_for is not None:
        argv += ["--gloo-iface-for", gloo_iface_for]
    return [*argv, "--"]


def endpoint(host: str, port: int) -> str:
    """``host:port``, with brackets for IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
