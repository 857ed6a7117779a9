"""Stream-socket channels for ``DistributedContext`` (``transport="direct"``):
the hub end here, the member end in ``direct_member``.

Why not only ZeroMQ: every ZeroMQ message crosses libzmq's I/O thread in
the sender and again in the receiver, three thread wake-ups per message
instead of one. On a small, busy machine that dominates a collective's
latency (measured here: a zmq ipc ping-pong p50 of ~120 us against ~20 us
for these sockets; see benchmarks/RESULTS-distributed.md).

Byte stream, per connection::

    member -> hub, once:  b"DLC1" + 16-byte routing id   (the preamble)
    then both ways:       8-byte big-endian length + one ``wire`` frame

Until the peer has authenticated (``trust``), frames over 4 KiB close the
connection, so an unauthenticated client cannot make us buffer gigabytes,
and a connection not authenticated within ``HANDSHAKE_S`` of its accept is
closed, so idle clients cannot hold our file descriptors. Anything that is
not a preamble (a ZeroMQ greeting, HTTP, random bytes) closes the connection
and counts as a dropped frame. Out of file descriptors (``EMFILE``), the hub
logs once, stops accepting for a moment and keeps serving its members.

Liveness: a process that dies closes its sockets, which the other side
sees at once as end-of-file; TCP keepalive and ``TCP_USER_TIMEOUT`` cover a
peer whose host vanished. A lost connection is final (no reconnect), so
``grace`` is 0.

Sends complete before they return (reading incoming frames meanwhile, so
two peers sending large frames to each other cannot deadlock): unlike a
ZeroMQ socket there is no background thread to finish them later.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import time
from collections import deque
from typing import Optional

from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import SLICE_MS, BindError, IdleTimeout
from determined_launch.core.distributed.transport.stream import (
    CHUNK,
    DONTWAIT,
    POLL_IN,
    POLL_OUT,
    PRE_LEN,
    PREAMBLE,
    UNTRUSTED_MAX,
    Conn,
    framed,
    parse_addr,
    passed,
    tune,
)

logger = logging.getLogger("determined_launch.core.distributed")

#: Seconds a connection may stay unauthenticated (as the control port's).
HANDSHAKE_S = 10.0
#: Seconds without accepting after the process ran out of file descriptors.
ACCEPT_PAUSE_S = 0.5
#: accept() errors that mean "no resources now", not "this connection failed"
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class DirectHubChannel:
    grace = 0.0

    def __init__(self, drops: wire.DropLog, where: str) -> None:
        self._drops = drops
        self._where = where
        self._listener: Optional[socket.socket] = None
        self._listen_fd = -1
        self._poll = select.poll()
        self._by_fd: dict[int, Conn] = {}
        self._by_rid: dict[bytes, Conn] = {}
        self._ready: deque[tuple[bytes, bytes]] = deque()
        self._scratch = memoryview(bytearray(CHUNK))
        self._next_sweep = 0.0
        self._paused_until: Optional[float] = None  # accepts paused (out of descriptors)
        self._exhausted_logged = False

    def bind(self, addr: str) -> str:
        family, sockaddr = parse_addr(addr)
        sock = socket.socket(family, socket.SOCK_STREAM)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
            sock.listen(512)
        except OSError as e:
            sock.close()
            raise BindError(e.errno == errno.EADDRINUSE, str(e)) from None
        sock.setblocking(False)
        self._listener = sock
        self._listen_fd = sock.fileno()
        self._poll.register(self._listen_fd, select.POLLIN)
        if family == socket.AF_UNIX:
            return addr
        host, port = sock.getsockname()[:2]
        return f"tcp://{'[' + host + ']' if family == socket.AF_INET6 else host}:{port}"

    # --- input
    def recv(self, block: bool) -> Optional[tuple[bytes, bytes]]:
        if not self._ready:
            self._pump(SLICE_MS if block else 0)
            if not self._ready:
                raise IdleTimeout
        return self._ready.popleft()

    def _pump(self, timeout_ms: int) -> None:
        ready = self._poll.poll(timeout_ms)
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        for fd, events in ready:
            if fd == self._listen_fd:
                self._accept()
                continue
            conn = self._by_fd.get(fd)
            if conn is None:
                continue
            if events & POLL_OUT:
                try:
                    conn.write()
                except OSError:
                    self._lost(conn)
                    continue
                if not conn.out:  # all written: stop asking for POLLOUT
                    self._poll.modify(fd, POLL_IN)
            if events & POLL_IN:
                self._read(conn)

    def _sweep(self, now: float) -> None:
        """Close connections that never authenticated; resume paused accepts."""
        self._next_sweep = now + 1.0
        for conn in list(self._by_fd.values()):
            if conn.limit == UNTRUSTED_MAX and now - conn.born > HANDSHAKE_S:
                self._reject(conn, f"no handshake within {HANDSHAKE_S:g}s")
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            if self._listen_fd >= 0:
                self._poll.register(self._listen_fd, select.POLLIN)

    def _accept(self) -> None:
        if self._listener is None:  # pragma: no cover
            return
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _EXHAUSTED:
                    self._pause_accepts(e)
                    return
                continue  # this connection failed (ECONNABORTED, ...): take the next
            tune(sock)
            conn = Conn(sock, None)
            self._by_fd[conn.fd] = conn
            self._poll.register(conn.fd, POLL_IN)

    def _pause_accepts(self, error: OSError) -> None:
        """The listener stays readable while accept() fails: stop polling it
        for a moment instead of spinning (``_sweep`` resumes)."""
        if not self._exhausted_logged:
            self._exhausted_logged = True
            logger.warning("DistributedContext on %s cannot accept connections (%s); "
                           "serving its members, retrying every %gs, closing connections "
                           "not authenticated within %gs", self._where,
                           error.strerror or error, ACCEPT_PAUSE_S, HANDSHAKE_S)
        self._poll.unregister(self._listen_fd)
        now = time.monotonic()
        self._paused_until = now + ACCEPT_PAUSE_S
        self._next_sweep = min(self._next_sweep, self._paused_until)

    def _read(self, conn: Conn) -> None:
        if conn.rid is None:
            self._preamble(conn)
            return
        frames = conn.read(self._scratch)
        if frames is None:
            self._lost_or_bad(conn)
            return
        for frame in frames:
            self._ready.append((conn.rid, frame))

    def _preamble(self, conn: Conn) -> None:
        """Read a new connection's routing id, then any frames after it."""
        try:
            n = conn.sock.recv_into(self._scratch)
        except BlockingIOError:
            return
        except OSError:
            n = 0
        if not n:
            self._lost(conn)
            return
        conn.buf += self._scratch[:n]
        head = bytes(conn.buf[:PRE_LEN])
        if not (PREAMBLE.startswith(head) or head.startswith(PREAMBLE)):
            self._reject(conn, "connection without a determined_launch preamble")
            return
        if len(head) < PRE_LEN:
            return
        rid = head[len(PREAMBLE) :]
        if rid in self._by_rid:
            self._reject(conn, "second connection with a routing id in use")
            return
        del conn.buf[:PRE_LEN]
        conn.rid = rid
        self._by_rid[rid] = conn
        frames = conn.frames()
        if frames is None:
            self._lost_or_bad(conn)
            return
        for frame in frames:
            self._ready.append((rid, frame))

    def _lost_or_bad(self, conn: Conn) -> None:
        if conn.problem:
            self._reject(conn, conn.problem)
        else:
            self._lost(conn)

    def _reject(self, conn: Conn, reason: str) -> None:
        self._drops.drop(reason, self._where)
        self._lost(conn)

    def _lost(self, conn: Conn) -> None:
        if not conn.alive:
            return
        conn.alive = False
        self._poll.unregister(conn.fd)
        del self._by_fd[conn.fd]
        if conn.rid is not None and self._by_rid.get(conn.rid) is conn:
            del self._by_rid[conn.rid]
        conn.sock.close()

    # --- output
    def send(self, peer: bytes, frame: bytes) -> bool:
        return not self.send_many([peer], frame, time.monotonic() + SLICE_MS / 1000)

    def send_many(
        self,
        peers: list[bytes],
        frame: bytes,
        deadline: Optional[float] = None,
        begun: tuple[Conn, ...] = (),
    ) -> list[bytes]:
        """See ``HubChannel.send_many``. ``begun``: connections that already
        hold part of this frame in their output (``fused`` hands them over),
        to be finished like the others."""
        lost: list[bytes] = []
        pending: list[Conn] = []
        for started in begun:
            pending.append(started)
            self._poll.modify(started.fd, POLL_IN | POLL_OUT)
        chunks = framed(frame)
        whole = chunks[0]
        size = len(whole) if len(chunks) == 1 else -1
        by_rid = self._by_rid
        for peer in peers:
            conn = by_rid.get(peer)
            if conn is not None and size > 0 and not conn.out:
                # The usual case, kept short (it runs per peer): the frame
                # fits in the socket buffer.
                try:
                    sent = conn.sock.send(whole, DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    sent = -1
                if sent == size:
                    continue
                if sent >= 0:
                    conn.out.append(whole[sent:])
            else:
                sent = self._push(conn, chunks)
            if sent < 0:
                if conn is not None:
                    self._lost(conn)
                lost.append(peer)
            elif conn is not None and conn.out:
                pending.append(conn)
                self._poll.modify(conn.fd, POLL_IN | POLL_OUT)
        if not pending:
            return lost
        # Finish every send before returning, reading meanwhile (see module doc).
        while any(c.alive and c.out for c in pending):
            if passed(deadline):
                for conn in pending:
                    if conn.out:  # a partial frame would corrupt the stream
                        self._lost(conn)
                break
            self._pump(SLICE_MS)
        lost += [c.rid for c in pending if not c.alive and c.rid is not None]
        return lost

    def _push(self, conn: Optional[Conn], chunks: tuple[memoryview, ...]) -> int:
        """``send_many`` for a connection with a backlog (or a large frame):
        queue the frame behind what is waiting; -1 if the peer is gone."""
        if conn is None:
            return -1
        try:
            conn.push(chunks)
        except OSError:
            self._lost(conn)
            return -1
        return 0

    def reachable(self, peer: bytes, ping: bytes) -> bool:
        return peer in self._by_rid

    def trust(self, peer: bytes) -> None:
        conn = self._by_rid.get(peer)
        if conn is not None:
            conn.limit = 1 << 62

    def close(self, linger_ms: int) -> None:
        for conn in list(self._by_fd.values()):
            self._lost(conn)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            self._listen_fd = -1
