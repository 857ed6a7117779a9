"""Length-prefixed frames over one stream socket (for ``direct``).

A connection's bytes: once, member -> hub, ``PREAMBLE`` + a 16-byte
routing id; then, both ways, an 8-byte big-endian length and one ``wire``
frame. ``Conn`` buffers what is half read or half written; the channels in
``direct`` decide when to call it.
"""

from __future__ import annotations

import select
import socket
import time
from collections import deque
from typing import Optional, Union

PREAMBLE = b"DLC1"
RID_SIZE = 16
PRE_LEN = len(PREAMBLE) + RID_SIZE
LEN_SIZE = 8
UNTRUSTED_MAX = 4096
CHUNK = 256 * 1024
DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
#: poll() masks of both channel ends: readable (or closed), writable.
POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR
POLL_OUT = select.POLLOUT


def parse_addr(addr: str) -> tuple[socket.AddressFamily, Union[str, tuple[str, int]]]:
    """``ipc://path`` or ``tcp://host:port`` (``*`` for any host or port)."""
    if addr.startswith("ipc://"):
        return socket.AF_UNIX, addr[len("ipc://") :]
    if not addr.startswith("tcp://"):
        raise ValueError(f"unsupported address {addr!r}")
    host, _, port = addr[len("tcp://") :].rpartition(":")
    v6 = host.startswith("[")
    host = host.strip("[]")
    family = socket.AF_INET6 if v6 else socket.AF_INET
    return family, ("" if host == "*" else host, 0 if port == "*" else int(port))


def tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    if sock.family == socket.AF_UNIX:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 6000)


def framed(frame: bytes) -> tuple[memoryview, ...]:
    """A frame with its length prefix, built once however many peers get it."""
    head = len(frame).to_bytes(LEN_SIZE, "big")
    if len(frame) < CHUNK:
        return (memoryview(head + frame),)
    return (memoryview(head), memoryview(frame))


def passed(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() >= deadline


class Conn:
    """One stream: its socket, unparsed input, unsent output."""

    __slots__ = ("sock", "fd", "buf", "rid", "limit", "out", "alive", "problem", "born")

    def __init__(self, sock: socket.socket, rid: Optional[bytes]) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray()
        self.rid = rid
        self.limit = UNTRUSTED_MAX
        self.out: deque[memoryview] = deque()
        self.alive = True
        self.problem = ""
        self.born = time.monotonic()

    def push(self, chunks: tuple[memoryview, ...]) -> None:
        """Queue a framed message (``framed``) and write what the socket
        takes now; raise OSError if the connection is broken."""
        if not self.out and len(chunks) == 1:
            try:
                n = self.sock.send(chunks[0], DONTWAIT)
            except BlockingIOError:
                n = 0
            if n < len(chunks[0]):
                self.out.append(chunks[0][n:])
            return
        self.out.extend(chunks)
        self.write()

    def write(self) -> None:
        """Write what the socket takes now; raise OSError if it is broken."""
        out = self.out
        while out:
            try:
                n = self.sock.send(out[0], DONTWAIT)
            except BlockingIOError:
                return
            if n == len(out[0]):
                out.popleft()
            else:
                out[0] = out[0][n:]
                return

    def read(self, scratch: memoryview, flags: int = 0) -> Optional[list[bytes]]:
        """Frames completed by what arrived; None on end-of-file or a broken
        or misbehaving connection (``problem`` says which).

        Reads into ``scratch``, a preallocated buffer: ``recv(n)`` would
        allocate ``n`` bytes per call, and at this size that is an mmap.
        """
        try:
            n = self.sock.recv_into(scratch, 0, flags)
        except BlockingIOError:
            return []
        except OSError:
            return None
        return self.take(scratch, n)

    def take(self, scratch: memoryview, n: int) -> Optional[list[bytes]]:
        """``read`` after the receive: ``n`` bytes arrived in ``scratch``
        (0 is end-of-file)."""
        if not n:
            return None
        if not self.buf and self.rid is not None and n >= LEN_SIZE:
            # Fast path: exactly one whole frame, the usual case.
            size = int.from_bytes(scratch[:LEN_SIZE], "big")
            if n == LEN_SIZE + size and size <= self.limit:
                return [bytes(scratch[LEN_SIZE:n])]
        self.buf += scratch[:n]
        return self.frames()

    def frames(self) -> Optional[list[bytes]]:
        out: list[bytes] = []
        buf = self.buf
        pos = 0
        while len(buf) - pos >= LEN_SIZE:
            n = int.from_bytes(buf[pos : pos + LEN_SIZE], "big")
            if n > self.limit:
                self.problem = f"{n}-byte frame from an unauthenticated connection"
                return None
            end = pos + LEN_SIZE + n
            if end > len(buf):
                break
            out.append(bytes(buf[pos + LEN_SIZE : end]))
            pos = end
        if pos:
            del buf[:pos]
        return out
