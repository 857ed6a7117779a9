"""``python -m determined_launch.nodeexec.sshd --sshd PATH --config F --addr A --port P``

Runs the job's sshd in the foreground (a "service" process of the plan),
after the two decisions that need the running machine:

* listen on the node's own address when it is one of this machine's, so
  several simulated nodes can share a port on loopback; otherwise (NAT,
  port mapping) on every address, as a container's sshd usually does;
* when root, create sshd's privilege separation directory (``/run/sshd`` on
  Debian), which the distribution's service scripts normally create.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Optional

from determined_launch.nodeexec.gate import exec_or_fail, is_local_address


def listen_address(addr: str, port: int) -> str:
    if not is_local_address(addr):
        return f"[::]:{port}" if ":" in addr else f"0.0.0.0:{port}"
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def privsep_dir(sshd: str) -> str:
    """Where this sshd wants its privilege separation directory.

    ``sshd -T`` would say, but refuses to run while the directory is
    missing, so look for the compiled-in path in the binary itself.
    """
    try:
        with open(sshd, "rb") as f:
            data = f.read()
    except OSError:
        data = b""
    for candidate in ("/run/sshd", "/var/run/sshd", "/var/empty"):
        if b"\0" + candidate.encode() + b"\0" in data:
            return candidate
    return "/run/sshd"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m determined_launch.nodeexec.sshd")
    p.add_argument("--sshd", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--addr", required=True)
    p.add_argument("--port", type=int, required=True)
    ns = p.parse_args(argv)
    if os.geteuid() == 0:
        d = privsep_dir(ns.sshd)
        if not os.path.isdir(d):
            os.makedirs(d, mode=0o755, exist_ok=True)
    argv_sshd = [
        ns.sshd,  # sshd insists on an absolute path (it re-executes itself)
        "-D",
        "-e",
        "-f",
        ns.config,
        "-o",
        f"ListenAddress={listen_address(ns.addr, ns.port)}",
    ]
    return exec_or_fail(argv_sshd)


if __name__ == "__main__":
    sys.exit(main())
