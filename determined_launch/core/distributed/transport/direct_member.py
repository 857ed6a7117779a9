"""The member end of the stream-socket transport (``direct``; see
``direct`` for the byte stream and why it exists)."""

from __future__ import annotations

import select
import socket
import time
from collections import deque
from typing import Optional, Union

from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import SLICE_MS, IdleTimeout
from determined_launch.core.distributed.transport.stream import (
    CHUNK,
    DONTWAIT,
    LEN_SIZE,
    POLL_IN,
    POLL_OUT,
    PREAMBLE,
    UNTRUSTED_MAX,
    Conn,
    framed,
    parse_addr,
    passed,
    tune,
)


class DirectMemberChannel:
    """One non-blocking socket to the hub. Waiting is a ``poll`` for input
    and then a read, not a blocking read bounded by ``SO_RCVTIMEO`` (one
    system call fewer): on a Unix stream socket the kernel wakes a blocked
    reader whenever the hub reads what this member sent (the write-space
    wakeup is filtered by event for ``poll`` only), so a blocking read cost
    every collective a second context switch, which on a machine with more
    ranks than cores made collectives slower, not faster. Sends use
    ``MSG_DONTWAIT`` and only poll for output when a frame does not fit in
    the socket buffer."""

    grace = 0.0

    def __init__(self, drops: wire.DropLog, where: str, rid: bytes) -> None:
        self._drops = drops
        self._where = where
        self._rid = rid
        self._addr: Optional[tuple[socket.AddressFamily, Union[str, tuple[str, int]]]] = None
        self._conn: Optional[Conn] = None
        self._poll = select.poll()
        self._early: list[bytes] = []
        self._ready: deque[bytes] = deque()
        self._scratch = memoryview(bytearray(CHUNK))
        self._down_since: Optional[float] = None
        self._limit = UNTRUSTED_MAX

    def connect(self, addr: str) -> None:
        self._addr = parse_addr(addr)
        self._try_connect()

    def _try_connect(self) -> Optional[Conn]:
        """The connection, opening it if the hub is listening by now. The
        hub may start after its members, so until the first connection
        frames wait in ``_early``; a connection once lost stays lost."""
        if self._conn is not None or self._down_since is not None or self._addr is None:
            return self._conn
        family, sockaddr = self._addr
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(SLICE_MS / 1000)
        try:
            sock.connect(sockaddr)
        except OSError:
            sock.close()
            return None
        tune(sock)
        conn = Conn(sock, self._rid)
        self._poll.register(conn.fd, POLL_IN)
        conn.limit = self._limit
        self._conn = conn
        conn.out.append(memoryview(PREAMBLE + self._rid))
        for frame in self._early:
            conn.out.extend(framed(frame))
        self._early.clear()
        self._flush(conn)
        return conn

    def send(self, frame: bytes, deadline: Optional[float] = None) -> bool:
        conn = self._conn
        if conn is not None and conn.alive and not conn.out:
            # Fast path: the frame fits in the socket buffer, as usual.
            data = len(frame).to_bytes(LEN_SIZE, "big") + frame
            try:
                n = conn.sock.send(data, DONTWAIT)
            except BlockingIOError:
                n = 0
            except OSError:
                self._lost(conn)
                return True
            if n == len(data):
                return True
            conn.out.append(memoryview(data)[n:])
            return self._flush(conn, deadline)
        if conn is None:
            conn = self._try_connect()
            if conn is None:
                if self._down_since is None:
                    self._early.append(frame)
                return True
        if conn.alive:
            try:
                conn.push(framed(frame))
            except OSError:
                self._lost(conn)
                return True
            if conn.out:
                return self._flush(conn, deadline)
        return True

    def _flush(self, conn: Conn, deadline: Optional[float] = None) -> bool:
        """Write everything queued, reading meanwhile (see the module doc)."""
        poller: Optional[select.poll] = None
        while conn.alive and conn.out:
            try:
                conn.write()
            except OSError:
                self._lost(conn)
                return True
            if not conn.out:
                return True
            if passed(deadline):
                self._lost(conn)  # a partial frame would corrupt the stream
                return False
            if poller is None:
                poller = select.poll()
                poller.register(conn.fd, POLL_IN | POLL_OUT)
            for _, events in poller.poll(SLICE_MS):
                if events & POLL_IN:
                    self._read(conn, DONTWAIT)
        return True

    def _read(self, conn: Conn, flags: int) -> None:
        self._queue(conn, conn.read(self._scratch, flags))

    def _queue(self, conn: Conn, frames: Optional[list[bytes]]) -> None:
        """Queue what ``conn.read`` returned; None means the connection ended."""
        if frames is None:
            if conn.problem:
                self._drops.drop(conn.problem, self._where)
            self._lost(conn)
        else:
            self._ready += frames

    def recv(self, block: bool) -> bytes:
        if self._ready:
            return self._ready.popleft()
        conn = self._conn or self._try_connect()
        if conn is None or not conn.alive:
            if block:
                time.sleep(0.05)
            raise IdleTimeout
        if block and not self._poll.poll(SLICE_MS):
            raise IdleTimeout
        frames = conn.read(self._scratch, DONTWAIT)
        if frames and len(frames) == 1:
            return frames[0]  # the usual case, without the queue
        self._queue(conn, frames)
        if not self._ready:
            raise IdleTimeout
        return self._ready.popleft()

    def _lost(self, conn: Conn) -> None:
        if conn.alive:
            conn.alive = False
            self._poll.unregister(conn.fd)
            conn.sock.close()
            self._down_since = time.monotonic()

    def trust(self) -> None:
        self._limit = 1 << 62
        if self._conn is not None:
            self._conn.limit = self._limit

    def hub_down_since(self, now: float) -> Optional[float]:
        return self._down_since

    def close(self, linger_ms: int) -> None:
        if self._conn is not None and self._conn.alive:
            self._conn.alive = False
            self._conn.sock.close()
        self._down_since = self._down_since or time.monotonic()
