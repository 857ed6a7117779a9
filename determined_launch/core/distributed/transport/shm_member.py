"""The member end of the shared-memory channels (see ``shm`` for the design)."""

from __future__ import annotations

import os
import select
import socket
import time
from typing import Optional

from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import IdleTimeout
from determined_launch.core.distributed.transport.direct_member import DirectMemberChannel
from determined_launch.core.distributed.transport.shm import (
    ANC_SIZE,
    OFFER_FDS,
    ROOM_WAIT_MS,
    Mapped,
    close_all,
    descriptors,
)
from determined_launch.core.distributed.transport.stream import (
    DONTWAIT,
    SHM_PREAMBLE,
    Conn,
    passed,
)


class ShmMemberChannel(DirectMemberChannel):
    """A direct member that switches to rings when its hub offers them."""

    preamble = SHM_PREAMBLE

    def __init__(self, drops: wire.DropLog, where: str, rid: bytes) -> None:
        super().__init__(drops, where, rid)
        self._link: Optional[Mapped] = None
        self._hub_bell = -1
        self._trusted = False
        self._anc_scratch = [self._scratch]
        self._wakes = bytearray(256)

    def trust(self) -> None:
        super().trust()
        self._trusted = True

    def _unix(self) -> bool:
        return self._addr is not None and self._addr[0] == socket.AF_UNIX

    # --- before the switch: socket reads that can carry descriptors
    def _read(self, conn: Conn, flags: int) -> None:
        if self._link is not None:
            self._wake_event(conn, flags)
            return
        if not self._unix():
            super()._read(conn, flags)
            return
        try:
            n, anc, _, _ = conn.sock.recvmsg_into(
                self._anc_scratch, ANC_SIZE, flags | getattr(socket, "MSG_CMSG_CLOEXEC", 0)
            )
        except BlockingIOError:
            return
        except OSError:
            n, anc = 0, []
        fds = descriptors(anc)
        frames = conn.take(self._scratch, n)
        if frames is None:
            close_all(fds)
            if conn.problem:
                self._drops.drop(conn.problem, self._where)
            self._lost(conn)
            return
        for frame in frames:
            if frame:
                self._ready.append(frame)
            elif self._trusted and self._link is None and len(fds) == OFFER_FDS:
                self._switch(conn, fds)
                fds = []
            else:
                self._drops.drop("unexpected shared-memory offer", self._where)
        close_all(fds)

    def _switch(self, conn: Conn, fds: list[int]) -> None:
        memfd, hub_bell = fds
        try:
            self._link = Mapped(memfd, False)
        except (OSError, ValueError):
            os.close(hub_bell)
            self._drops.drop("unusable shared-memory offer", self._where)
            self._lost(conn)
            return
        finally:
            os.close(memfd)
        self._hub_bell = hub_bell
        conn.buf.clear()  # wake-up bytes that came with the offer, if any

    # --- input
    def recv(self, block: bool) -> bytes:
        # The hot path of every collective on every member: kept flat.
        if self._ready:
            return self._ready.popleft()
        link = self._link
        conn = self._conn
        if link is None or conn is None:
            if self._unix():
                return self._recv_before_switch(block)
            return super().recv(block)
        # No look at the ring first: the hub rarely answers that fast, and
        # a wake-up byte already sent makes this return at once anyway.
        self._wake_event(conn, 0 if block else DONTWAIT)
        if self._link is None:  # lost meanwhile; what arrived before is in _ready
            if self._ready:
                return self._ready.popleft()
            raise IdleTimeout
        frames = link.inb.frames()
        if not frames:
            if frames is None:
                self._broken()
            raise IdleTimeout
        if link.inb.writer_waiting:
            os.eventfd_write(self._hub_bell, 1)
        if len(frames) > 1:
            self._ready.extend(frames[1:])
        return frames[0]

    def _wake_event(self, conn: Conn, flags: int) -> None:
        """Wait for wake-up bytes (at most one slice: ``SO_RCVTIMEO``);
        end-of-file means the hub is gone."""
        try:
            n = conn.sock.recv_into(self._wakes, 0, flags)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = 0
        if not n:
            self._lost(conn)

    def _recv_before_switch(self, block: bool) -> bytes:
        if not self._ready:
            conn = self._conn or self._try_connect()
            if conn is None or not conn.alive:
                if block:
                    time.sleep(0.05)
                raise IdleTimeout
            self._read(conn, 0 if block else DONTWAIT)
            if self._link is not None and not self._ready:
                return self.recv(False)
        if not self._ready:
            raise IdleTimeout
        return self._ready.popleft()

    def _broken(self) -> None:
        self._drops.drop("unparsable frame length in shared memory", self._where)
        if self._conn is not None:
            self._lost(self._conn)

    # --- output
    def send(self, frame: bytes, deadline: Optional[float] = None) -> bool:
        link = self._link
        if link is None:
            return super().send(frame, deadline)
        done = link.out.put_frame(frame)
        os.eventfd_write(self._hub_bell, 1)
        while not done:
            conn = self._conn
            if conn is None or not conn.alive:
                return True  # the loss is reported by the next receive
            if passed(deadline):
                self._lost(conn)  # a partial frame would corrupt the ring
                return False
            # Wait for the hub to make room (it wakes us), reading meanwhile.
            select.select([conn.fd], [], [], ROOM_WAIT_MS / 1000)
            self._wake_event(conn, DONTWAIT)
            if self._link is None:
                return True
            frames = link.inb.frames()
            if frames is None:
                self._broken()
                return True
            self._ready.extend(frames)
            done = link.out.put()
            os.eventfd_write(self._hub_bell, 1)
        return True

    def _lost(self, conn: Conn) -> None:
        link = self._link
        if link is not None:
            self._ready.extend(link.inb.frames() or ())  # what came before the loss
        super()._lost(conn)
        self._release()

    def _release(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
        if self._hub_bell >= 0:
            os.close(self._hub_bell)
            self._hub_bell = -1

    def close(self, linger_ms: int) -> None:
        super().close(linger_ms)
        self._release()
