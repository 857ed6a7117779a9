"""``python -m determined_launch.nodeexec.gate [CHECKS...] -- CMD...``: check, then exec.

A plan's processes are plain argv lists, so anything that must happen at
run time right before a command starts goes through this small gate, which
then replaces itself with the command (same pid, same process group, so the
supervisor sees the command itself):

* ``--wait-tcp HOST:PORT`` / ``--wait-ssh HOST:PORT``: wait until the
  endpoint accepts connections (and, for ssh, greets with ``SSH-``): the
  chief waits for every peer's sshd before horovodrun or pdsh connects, and
  ssh-free Horovod workers wait for the rendezvous server. On timeout it
  names the endpoint and exits with status 1, failing the job.
* ``--node-env``: load this node's worker variables from ``node-env.json``
  (see ``backends/ssh.py``): on a peer, sshd's ``SetEnv`` points to it; on
  the chief, the launcher does. They replace whatever the remote launcher
  forwarded on the command line (the chief's paths), and carry the secret.
* ``--gloo-iface-for ADDR``: set ``HOROVOD_GLOO_IFACE`` to the interface
  that holds ADDR (unless the user set it), which Horovod's gloo needs to
  listen on the right network.

It runs before every worker, so it imports little: the standard library,
envvars, and psutil only for ``--gloo-iface-for``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Optional

from determined_launch import envvars

SSHD_NODE_ENV = envvars.SSHD_NODE_ENV
NODE_ENV_FILE = envvars.NODE_ENV_FILE
GLOO_IFACE = "HOROVOD_GLOO_IFACE"
EXIT_GATE_FAILED = 1


class GateError(Exception):
    pass


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise GateError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def probe(host: str, port: int, ssh: bool, timeout: float = 2.0) -> bool:
    """One attempt: can we connect (and does an sshd greet us)?

    For sshd, read its whole greeting and answer with ours before closing:
    a client that hangs up earlier makes sshd log an error
    ("kex_exchange_identification: ...") on the other node.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            if not ssh:
                return True
            s.settimeout(timeout)
            greeting = b""
            while not greeting.endswith(b"\n") and len(greeting) < 256:
                chunk = s.recv(256)
                if not chunk:
                    break
                greeting += chunk
            if not greeting.startswith(b"SSH-"):
                return False
            s.sendall(b"SSH-2.0-det-launch-probe\r\n")
            return True
    except OSError:
        return False


def wait_for(endpoints: Sequence[tuple[str, int, bool]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(endpoints)
    delay = 0.05
    while pending:
        pending = [e for e in pending if not probe(*e)]
        if not pending:
            return
        if time.monotonic() > deadline:
            host, port, ssh = pending[0]
            what = "the job's sshd" if ssh else "the rendezvous server"
            hint = (
                "is det-launch running there with --ssh and the same DTRAIN_SSH_PORT?"
                if ssh
                else "did the chief's launcher start?"
            )
            raise GateError(f"{what} at {host}:{port} did not answer within {timeout:g}s; {hint}")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def load_node_env(environ: dict[str, str]) -> None:
    path = environ.get(SSHD_NODE_ENV) or environ.get(NODE_ENV_FILE)
    if not path:
        raise GateError(f"--node-env: neither {SSHD_NODE_ENV} nor {NODE_ENV_FILE} is set")
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError) as e:
        raise GateError(f"--node-env: cannot read {path}: {e}") from None
    if not isinstance(values, dict):
        raise GateError(f"--node-env: {path}: expected a JSON object")
    environ.update({str(k): str(v) for k, v in values.items()})


def is_local_address(addr: str) -> bool:
    """Whether this machine can listen on ``addr`` (not so behind NAT)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
    except OSError:
        return False
    return True


def iface_for(addr: str) -> Optional[str]:
    """The network interface whose subnet holds ``addr`` (lo for 127.0.0.2)."""
    import psutil

    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(addr))
        except (OSError, ValueError):
            return None
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family not in (socket.AF_INET, socket.AF_INET6) or not a.netmask:
                continue
            try:
                net = ipaddress.ip_network(f"{a.address.split('%')[0]}/{a.netmask}", strict=False)
            except ValueError:
                continue
            if ip.version == net.version and ip in net:
                return name
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m determined_launch.nodeexec.gate [CHECKS...] -- CMD...",
              file=sys.stderr)
        return 2
    i = argv.index("--")
    own, command = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m determined_launch.nodeexec.gate")
    p.add_argument("--wait-tcp", action="append", default=[])
    p.add_argument("--wait-ssh", action="append", default=[])
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--node-env", action="store_true")
    p.add_argument("--gloo-iface-for")
    ns = p.parse_args(own)
    if not command:
        print("gate: no command after --", file=sys.stderr)
        return 2
    environ = dict(os.environ)
    try:
        if ns.node_env:
            load_node_env(environ)
        endpoints = [(*parse_endpoint(e), False) for e in ns.wait_tcp]
        endpoints += [(*parse_endpoint(e), True) for e in ns.wait_ssh]
        wait_for(endpoints, ns.timeout)
        if ns.gloo_iface_for and not environ.get(GLOO_IFACE):
            iface = iface_for(ns.gloo_iface_for)
            if iface:
                environ[GLOO_IFACE] = iface
    except GateError as e:
        print(f"det-launch: error: {e}", file=sys.stderr, flush=True)
        return EXIT_GATE_FAILED
    return exec_or_fail(command, environ)


def exec_or_fail(argv: Sequence[str], environ: Optional[dict[str, str]] = None) -> int:
    """Become ``argv``; if that cannot happen, say why in one line and return
    127 (the shell's "cannot run"). Shared by the node programs."""
    try:
        os.execvpe(argv[0], list(argv), os.environ if environ is None else environ)
    except OSError as e:
        print(f"det-launch: error: cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
