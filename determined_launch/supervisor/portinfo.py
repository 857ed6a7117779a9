"""Who holds a TCP port on this host, read from ``/proc`` (Linux): the control
channel's bind error names it, so a port held by a frozen launcher of an
earlier generation is told apart from another program's."""

from __future__ import annotations

import os
from typing import Optional


def port_holder(port: int) -> Optional[str]:
    """Who listens on TCP ``port`` on this host, if this user may see it:
    ``pid N (name)``, from ``/proc`` (Linux); ``None`` if unknown."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = [line.split() for line in f.readlines()[1:2049]]
        except (OSError, ValueError):
            continue
        for row in rows:  # local address "HEX:PORT", state 0A is LISTEN, inode 10th
            if len(row) > 9 and row[3] == "0A" and row[1].rsplit(":", 1)[-1] == f"{port:04X}":
                inodes.add(f"socket:[{row[9]}]")
    if not inodes:
        return None
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                    name = f.read(64).strip()
                return f"pid {pid} ({name}{_state(pid)})"
        except OSError:
            continue
    return None


def _state(pid: str) -> str:
    """``, stopped`` for a stopped process (a SIGSTOPped launcher still holds its ports)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read(512).rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return ""
    return ", stopped" if state in ("T", "t") else ""
