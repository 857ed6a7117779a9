"""A real SLURM cluster in a temporary directory, for end-to-end tests.

One ``slurmctld`` and two ``slurmd -N n1|n2`` run from a ``slurm.conf`` in a
temp dir, authenticated by a private ``munged`` (key from ``mungekey``,
socket named by ``AuthInfo=socket=...``). Both emulated nodes run on this
machine, but with different addresses (``NodeAddr`` 127.0.0.1 and
127.0.0.2), so the launcher sees two hosts. Nothing is faked: when the
daemons cannot start (not root, packages missing) the fixture skips with the
reason and the daemon logs.

Use the session fixture ``slurm_cluster`` (import it into the test module);
``cluster.env`` is the environment for ``srun``/``sbatch``/``scancel``.
Install the packages with ``scripts/install_slurm.sh``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Callable, Optional

import pytest

from tests._ports import free_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo", "scontrol")
NODES = (("n1", "127.0.0.1"), ("n2", "127.0.0.2"))
CPUS_PER_NODE = 2
START_TIMEOUT = 30.0


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Daemons get SIGTERM if the test process dies without its teardown."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ClusterUnavailable(Exception):
    """The cluster could not start here; the message says why."""


def _slurm_conf(d: str, ctld_port: int, node_ports: Sequence[int], munge_socket: str) -> str:
    host = socket.gethostname().split(".")[0]
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr={addr} Port={port} "
        f"CPUs={CPUS_PER_NODE} State=UNKNOWN"
        for (name, addr), port in zip(NODES, node_ports)
    )
    names = ",".join(name for name, _ in NODES)
    return f"""\
ClusterName=detlaunch
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MessageTimeout=5
KillWait=5
InactiveLimit=0
MinJobAge=2
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """Starts munged, slurmctld and one slurmd per emulated node."""

    def __init__(self, workdir: str) -> None:
        self.dir = workdir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.conf = os.path.join(workdir, "slurm.conf")
        self.nodes = [name for name, _ in NODES]
        self.node_addrs = dict(NODES)
        self.env: dict[str, str] = {}

    # --- lifecycle -----------------------------------------------------
    def start(self) -> None:
        missing = [t for t in DAEMONS if shutil.which(t) is None]
        if missing:
            raise ClusterUnavailable(f"missing {', '.join(missing)} (run scripts/install_slurm.sh)")
        if os.geteuid() != 0:
            raise ClusterUnavailable("the test cluster's slurmd and munged need root")
        os.chmod(self.dir, 0o755)  # slurmd and munged check parent permissions
        munge_dir = os.path.join(self.dir, "munge")
        os.mkdir(munge_dir, 0o700)
        sock_dir = os.path.join(self.dir, "munge-sock")
        os.mkdir(sock_dir, 0o755)
        os.makedirs(os.path.join(self.dir, "state"), 0o700)
        key = os.path.join(munge_dir, "munge.key")
        sock = os.path.join(sock_dir, "munge.socket")
        self._check(["mungekey", "--create", f"--keyfile={key}"], "mungekey")
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={munge_dir}/munged.pid",
                f"--log-file={munge_dir}/munged.log",
                f"--seed-file={munge_dir}/munged.seed",
            ],
        )
        self._wait(lambda: os.path.exists(sock), "munged socket", f"{munge_dir}/munged.log")

        ports = [free_port() for _ in range(1 + len(NODES))]
        with open(self.conf, "w", encoding="utf-8") as f:
            f.write(_slurm_conf(self.dir, ports[0], ports[1:], sock))
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        for var in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
            if var != "SLURM_CONF":
                del self.env[var]

        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", self.conf])
        self._wait(self._all_idle, "both nodes idle", f"{self.dir}/slurmctld.log")

    def stop(self) -> None:
        if self.env:
            subprocess.run(
                ["scancel", "--full", "--quiet", "--user=root"],
                env=self.env,
                capture_output=True,
                timeout=10,
                check=False,
            )
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    # --- helpers for tests ---------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command against this cluster."""
        return subprocess.run(
            list(argv),
            env={**self.env, **(env or {})},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def logs(self) -> str:
        out = []
        for name in ["slurmctld.log"] + [f"slurmd-{n}.log" for n in self.nodes]:
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    out.append(f"--- {name} (tail)\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def wait_idle(self, timeout: float = 20) -> None:
        """Wait until the previous test's jobs are gone and nodes are idle."""
        self._wait(self._all_idle, "nodes idle again", f"{self.dir}/slurmctld.log", timeout)

    # --- internals -----------------------------------------------------
    def _check(self, argv: list[str], what: str) -> None:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if r.returncode:
            raise ClusterUnavailable(f"{what} failed: {r.stderr.strip()}")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(os.path.join(self.dir, f"{name}.stderr"), "wb")  # noqa: SIM115
        env = self.env or dict(os.environ)
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
        log.close()
        self.procs.append((name, proc))

    def _all_idle(self) -> bool:
        r = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format=%N %T"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def _wait(
        self, ready: Callable[[], bool], what: str, log: str, timeout: float = START_TIMEOUT
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [(n, p.returncode) for n, p in self.procs if p.poll() is not None]
            if dead:
                raise ClusterUnavailable(
                    f"{dead[0][0]} exited with status {dead[0][1]} while waiting for {what}; "
                    + self._tail(os.path.join(self.dir, f"{dead[0][0]}.stderr"))
                    + self._tail(log)
                )
            if ready():
                return
            time.sleep(0.1)
        raise ClusterUnavailable(
            f"timed out after {timeout:.0f}s waiting for {what}; {self._tail(log)}"
        )

    @staticmethod
    def _tail(path: str) -> str:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f"{path}: " + " | ".join(line.strip() for line in f.readlines()[-5:])
        except OSError:
            return ""


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running two-node SLURM cluster, or a skip saying why there is none."""
    # A short path: munged and slurmd use Unix sockets (108-byte limit).
    workdir = tempfile.mkdtemp(prefix="detslurm-")
    cluster = SlurmCluster(workdir)
    try:
        try:
            cluster.start()
        except (ClusterUnavailable, OSError, subprocess.SubprocessError) as e:
            pytest.skip(f"cannot start a test SLURM cluster: {e}")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
