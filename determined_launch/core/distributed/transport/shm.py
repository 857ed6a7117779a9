"""Shared-memory channels for same-host links (part of ``transport="direct"``).

Why: on one host, a collective over stream sockets costs the hub one
``recv`` per member and one ``send`` per member of the result, each a
system call that copies the frame through the kernel, and on a small
machine that work, not the bytes, sets the latency (see
benchmarks/RESULTS-distributed.md). Here each member link is a pair of
rings (``ring``) in one shared-memory file, and wake-ups are ``eventfd``
a member's part is one copy into its ring and one ``eventfd_write`` on
the hub's doorbell, through which the hub learns of any number of parts
with one ``eventfd_read``; the hub wakes a member with one byte on the
member's Unix socket, so a member waits in one blocking ``recv`` that also
sees the hub's death (end-of-file) and has a timeout (``SO_RCVTIMEO``).

How a link switches, after the socket handshake (``links``):

1. a member that can switch opens its connection with ``SHM_PREAMBLE``;
2. when the hub trusts that member (its READY was authenticated), it sends
   over the Unix socket one empty frame carrying, as ``SCM_RIGHTS``, a
   ``memfd`` with the two rings and the hub's doorbell (an ``eventfd``);
3. from then on every frame both ways goes through the rings, and the
   socket carries only wake-up bytes from the hub.

Nothing has a name in the file system (nothing to leak when a process is
killed, nothing another user could open), and the file descriptors only
reach a peer that proved it knows the job secret. Frames in the rings are
the same HMAC-authenticated ``wire`` frames as on a socket: shared memory
changes how bytes move, not what is trusted.

The Unix socket stays open for liveness: a process that dies closes it, and
its peer sees end-of-file at once while it waits (the hub polls every
member's socket with its doorbell). Frames already in the ring are
delivered before the loss.

Used on Linux x86-64 only (``SUPPORTED``): the rings rely on its store
order (see ``ring``). Elsewhere, or with ``transport="socket"``, the plain
stream-socket channels run.
"""

from __future__ import annotations

import array
import mmap
import os
import platform
import select
import socket
import sys
from typing import Optional

from determined_launch.core.distributed.transport import ring, wire
from determined_launch.core.distributed.transport.direct import (
    DirectHubChannel,
)
from determined_launch.core.distributed.transport.stream import (
    DONTWAIT,
    LEN_SIZE,
    SHM_PREAMBLE,
    Conn,
    passed,
)

SUPPORTED = (
    sys.platform == "linux"
    and platform.machine() in ("x86_64", "AMD64")
    and hasattr(os, "eventfd")
    and hasattr(os, "memfd_create")
)
#: Data bytes per ring: one per direction per member. Pages are only
#: allocated when touched, so small collectives use a few KiB of it.
CAPACITY = 1 << 16
#: How long a writer waiting for room sleeps between checks, in case the
#: reader's wake-up was missed (the ``ring`` flag can race).
ROOM_WAIT_MS = 10
_OFFER = bytes(LEN_SIZE)  # an empty frame: the switch, with the descriptors
OFFER_FDS = 2  # the memfd and the hub's doorbell
_WAKE = b"\x01"  # hub -> member, on the socket: "look at your ring"
ANC_SIZE = socket.CMSG_SPACE(OFFER_FDS * array.array("i").itemsize)
_IN = select.POLLIN | select.POLLHUP | select.POLLERR


def _clear_bell(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


class Mapped:
    """One link's shared memory: the ring this end writes and the one it reads."""

    def __init__(self, fd: int, outbound_first: bool) -> None:
        self.mm = mmap.mmap(fd, 0)
        view = memoryview(self.mm)
        half = len(view) // 2
        capacity = half - ring.HEADER
        first, second = view[:half], view[half:]
        self.out = ring.Ring(first if outbound_first else second, capacity)
        self.inb = ring.Ring(second if outbound_first else first, capacity)
        view.release()

    def close(self) -> None:
        self.out.release()
        self.inb.release()
        self.mm.close()


class ShmHubChannel(DirectHubChannel):
    """A direct hub whose same-host members switch to rings after the handshake."""

    def __init__(self, drops: wire.DropLog, where: str) -> None:
        super().__init__(drops, where)
        self._bell = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._poll.register(self._bell, select.POLLIN)
        self._can_switch: set[bytes] = set()
        self._links: dict[bytes, tuple[Mapped, socket.socket]] = {}

    def _greeted(self, conn: Conn, magic: bytes) -> None:
        if magic == SHM_PREAMBLE and conn.sock.family == socket.AF_UNIX and conn.rid:
            self._can_switch.add(conn.rid)

    def trust(self, peer: bytes) -> None:
        super().trust(peer)
        conn = self._by_rid.get(peer)
        if conn is not None and peer in self._can_switch and not conn.out:
            self._offer(peer, conn)

    def _offer(self, rid: bytes, conn: Conn) -> None:
        fd = os.memfd_create("determined-launch-dist", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, 2 * ring.size(CAPACITY))
            link = Mapped(fd, True)
            fds = array.array("i", [fd, self._bell])
            sent = conn.sock.sendmsg([_OFFER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except BlockingIOError:  # pragma: no cover - the member stays on the socket
            return
        except OSError:
            self._lost(conn)
            return
        finally:
            os.close(fd)
        if sent != len(_OFFER):  # pragma: no cover - 8 bytes into an idle socket
            link.close()
            self._lost(conn)
            return
        self._links[rid] = (link, conn.sock)

    # --- input (``recv`` is the direct hub's: its poll includes the doorbell)
    def _other(self, fd: int) -> None:
        if fd == self._bell:
            _clear_bell(fd)
            self._take_all()

    def _take_all(self) -> None:
        for rid, (link, sock) in list(self._links.items()):
            inb = link.inb
            words = inb.words
            if words[ring.WRITE] == words[ring.READ]:
                continue  # nothing new: most links, most times; checked inline
            frames = inb.frames()
            if frames is None:
                self._reject(self._by_rid[rid], "unparsable frame length in shared memory")
                continue
            self._ready.extend((rid, frame) for frame in frames)
            if inb.writer_waiting:
                _wake(sock)

    def _lost(self, conn: Conn) -> None:
        entry = self._links.pop(conn.rid, None) if conn.rid is not None else None
        self._can_switch.discard(conn.rid or b"")
        if entry is not None:
            rid = conn.rid or b""
            frames = entry[0].inb.frames()  # what the member sent before it went
            self._ready.extend((rid, frame) for frame in frames or ())
            entry[0].close()
        super()._lost(conn)

    # --- output
    def send_many(
        self, peers: list[bytes], frame: bytes, deadline: Optional[float] = None
    ) -> list[bytes]:
        if not self._links:
            return super().send_many(peers, frame, deadline)
        by_socket: list[bytes] = []
        waiting: list[tuple[bytes, Mapped, socket.socket]] = []
        links = self._links
        for peer in peers:
            entry = links.get(peer)
            if entry is None:
                by_socket.append(peer)
                continue
            link, sock = entry
            if not link.out.put_frame(frame):
                waiting.append((peer, link, sock))
            try:
                sock.send(_WAKE, DONTWAIT)
            except OSError:  # full of wake-ups already, or closing: seen by the poll
                pass
        lost = super().send_many(by_socket, frame, deadline) if by_socket else []
        if waiting:
            lost += self._finish(waiting, deadline)
        return lost

    def _finish(
        self, waiting: list[tuple[bytes, Mapped, socket.socket]], deadline: Optional[float]
    ) -> list[bytes]:
        """Write the rest of a frame too big for the room its rings had,
        reading meanwhile (so two ends sending big frames can't deadlock)."""
        lost: list[bytes] = []
        while waiting:
            if passed(deadline):
                for peer, _, _ in waiting:
                    conn = self._by_rid.get(peer)
                    if conn is not None:  # a partial frame would corrupt the ring
                        self._lost(conn)
                return lost + [peer for peer, _, _ in waiting]
            self._pump(ROOM_WAIT_MS)
            still = []
            for peer, link, sock in waiting:
                if peer not in self._links:  # the member died meanwhile
                    lost.append(peer)
                    continue
                if not link.out.put():
                    still.append((peer, link, sock))
                _wake(sock)
            waiting = still
        return lost

    def close(self, linger_ms: int) -> None:
        super().close(linger_ms)
        if self._bell >= 0:
            os.close(self._bell)
            self._bell = -1


def _wake(sock: socket.socket) -> None:
    try:
        sock.send(_WAKE, DONTWAIT)
    except OSError:  # full of wake-ups already, or closing: seen by the poll
        pass


def descriptors(anc: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
