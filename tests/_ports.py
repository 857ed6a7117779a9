"""Free ports for the suite's jobs, picked where no other process will take them.

A port the kernel gave out for ``bind(port 0)`` lies in the ephemeral range, the
same range it draws the local port of every outgoing connection from. Under the
full suite hundreds of connections open each second (gloo pairs, stores, storage
clients), so a block picked there could be taken between the pick and the chief's
own bind, and the chief then rightly refused to start ("port ... is already in
use"), leaving node 1 waiting for it. Below the ephemeral range only an explicit
bind takes a port, and the suite's picks are random, so that race is gone.
Standard library only: worker scripts import this too.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: lowest port picked: above the registered services a test machine may run
LOWEST = 10_000
#: the default ``C10D_PORT`` block, left to code that relies on the default
DEFAULT_C10D = range(29_400, 29_420)

_pick = random.SystemRandom()  # unaffected by tests that seed ``random``


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default, also a safe bound elsewhere


def _all_free(base: int, n: int) -> bool:
    socks = []
    try:
        for port in range(base, base + n):
            s = socket.socket()
            socks.append(s)
            s.bind(("", port))  # all addresses, as the chief binds
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_port_block(n: int = 11) -> int:
    """A base port such that base..base+n-1 are free right now and outside the
    ephemeral range. The default covers generations 0-2 of a restarting job (each
    uses C10D_PORT + 4*g .. + 4*g + 2: generations.ports)."""
    top = _ephemeral_low() - n
    for _ in range(500):
        base = _pick.randrange(LOWEST, top)
        if any(p in DEFAULT_C10D for p in (base, base + n - 1)):
            continue
        if _all_free(base, n):
            return base
    raise RuntimeError(f"no {n} consecutive free ports between {LOWEST} and {top + n}")


def free_port() -> int:
    """One free port outside the ephemeral range."""
    return free_port_block(1)
