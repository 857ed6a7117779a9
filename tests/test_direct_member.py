"""The member end of the ``direct`` transport, as the kernel sees it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from determined_launch.core.distributed.transport.stream import LEN_SIZE

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts context switches in /proc"
)

# One member, alone in its process (so nothing else it runs can sleep): it
# sends a part, then counts its voluntary context switches while it waits
# for the reply.
_MEMBER = """
import logging, sys
from determined_launch.core.distributed.transport import links, wire
from determined_launch.core.distributed.transport.direct_member import DirectMemberChannel

def switches():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches"))

ch = DirectMemberChannel(wire.DropLog(logging.getLogger("t")), "test", links.new_rid())
ch.connect(sys.argv[1])
ch.send(b"part" * 25)
before = switches()
reply = ch.recv(block=True)
print(switches() - before, reply.decode())
"""


def test_a_waiting_member_sleeps_once_per_reply(tmp_path: Path) -> None:
    """The hub reading a member's part must not wake the member: a blocking
    read on a Unix stream socket is woken by the kernel's write-space
    notice when its peer reads (poll filters that notice out), and that
    second context switch per collective made 8-rank collectives on two
    cores measurably slower."""
    path = str(tmp_path / "hub.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(30)
    member = subprocess.Popen(
        [sys.executable, "-c", _MEMBER, f"ipc://{path}"], stdout=subprocess.PIPE, text=True
    )
    try:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30)
            time.sleep(0.05)  # the member is asleep in its wait by now, its part unread
            got = b""
            while not got.endswith(b"part"):
                got += conn.recv(4096)  # the read that must not wake it
            time.sleep(0.05)
            conn.sendall(len(b"reply").to_bytes(LEN_SIZE, "big") + b"reply")
            out, _ = member.communicate(timeout=30)
    finally:
        member.kill()
        listener.close()
    woken, reply = out.split()
    assert reply == "reply"
    assert int(woken) <= 1  # 0 only if it had not begun to wait: a very slow start
