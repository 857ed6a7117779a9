"""The member end of a link: every rank but the chief (and, on a node-local
link, every rank but the local chief). See ``links`` for the protocol.

A member sends its part and waits for the hub's answer; frames that arrive
early for a later collective are held. The hub's death (its connection
gone for the channel's ``grace``) or its ABORT fails the wait at once.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Callable, Optional

from determined_launch.core.distributed.errors import DistributedError
from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import IdleTimeout, MemberChannel
from determined_launch.core.distributed.transport.links import (
    Link,
    Peer,
    deadline_passed,
    error_body,
    error_info,
    mismatch,
    pack_hello,
)

#: A member gives up this long after the collective's deadline. The hub
#: times out at the deadline itself and names the ranks that did not come;
#: a member that timed out at the same instant could only name the hub, and
#: whichever report won the race became the job's error.
HUB_FIRST = 0.25


class Member(Link):
    """One connection to a hub."""

    def __init__(
        self,
        channel: MemberChannel,
        rid: bytes,
        *,
        rank: int,
        hub_rank: int,
        key: wire.MacKey,
        drops: wire.DropLog,
        where: str,
        role: str,
    ) -> None:
        super().__init__(rank, key, drops, where)
        self.ch = channel
        self.rid = rid
        self.hub_rank = hub_rank
        self.role = role
        self._last = 0
        self._held: deque[wire.Message] = deque()
        self.addr = ""
        #: ``fused.MemberIO``: what the allgather fast path binds once on the
        #: direct transport; None until it does.
        self.fast_io: Optional[tuple[Any, ...]] = None

    def connect(self, addr: str) -> None:
        self.addr = addr
        self.ch.connect(addr)

    def close(self, linger_ms: int) -> None:
        self.ch.close(linger_ms)

    def exchange(
        self,
        mtype: int,
        op: int,
        payload: bytes,
        want: tuple[int, ...],
        deadline: Optional[float],
        idle: Callable[[], None],
    ) -> tuple[int, memoryview]:
        """Send a contribution (none when ``mtype`` is 0), then return the
        hub's reply to collective ``op``: the hot path of every collective,
        kept short because its cost is paid on every rank, every call."""
        if mtype:
            self._seq += 1
            frame = wire.encode(self.skey, mtype, self.rank, self._seq, op, payload)  # type: ignore[arg-type]
            if not self.ch.send(frame, deadline):
                raise self._send_timeout(mtype)
        if not self._held:
            try:
                msg = self._accept(self.ch.recv(True))
            except IdleTimeout:
                msg = None
            if msg is not None:
                if msg.op == op and msg.mtype in want:
                    return msg.mtype, msg.payload
                self._held.append(msg)
        return self.wait_any(op, want, deadline, idle)

    def send(
        self, mtype: int, op: int, payload: bytes = b"", deadline: Optional[float] = None
    ) -> None:
        if not self.ch.send(self.frame(mtype, op, payload), deadline):
            raise self._send_timeout(mtype)

    def _send_timeout(self, mtype: int) -> DistributedError:
        return DistributedError(
            f"timed out sending a {wire.TYPE_NAMES[mtype]} message to rank {self.hub_rank} "
            f"({self.role}) at {self.addr}",
            [self.hub_rank],
        )

    def _accept(self, frame: bytes) -> Optional[wire.Message]:
        try:
            msg = wire.decode(frame, self.key, self.skey)
        except wire.BadFrame as e:
            self.drops.drop(str(e), self.where)
            return None
        if msg.sender != self.hub_rank or msg.seq <= self._last:
            self.drops.drop(f"replayed or misattributed frame from rank {msg.sender}", self.where)
            return None
        self._last = msg.seq
        if msg.mtype == wire.ABORT:
            raise self._aborted(msg.payload)
        if msg.mtype == wire.PING:
            return None
        return msg

    def _aborted(self, payload: memoryview) -> DistributedError:
        text, missing = error_info(payload)
        return DistributedError(f"{text} (reported to rank {self.rank})", missing, relayed=True)

    def report(self, error: DistributedError) -> None:
        """Best effort: tell the hub this member's collective failed, so it
        aborts the others instead of waiting for this member."""
        try:
            self.ch.send(self.frame(wire.FAIL, 0, error_body(error)), time.monotonic() + 0.5)
        except Exception:  # pragma: no cover - the link may be what failed
            pass

    def handshake(self, peer: Peer, deadline: Optional[float], idle: Callable[[], None]) -> bytes:
        """HELLO / WELCOME / READY / START; returns START's payload."""
        nonce = os.urandom(wire.NONCE_SIZE)
        self.ch.send(self.frame(wire.HELLO, 0, pack_hello(peer, nonce, self.rid)))
        while self.skey is None:
            msg = self._next(deadline, idle, "a welcome")
            if msg.mtype == wire.WELCOME and bytes(msg.payload[wire.NONCE_SIZE :]) == nonce:
                self.skey = wire.session_key(self.key, bytes(msg.payload[: wire.NONCE_SIZE]))
                self.ch.trust()
            else:
                self.drops.drop("stale welcome", self.where)
        self.send(wire.READY, 0)
        while True:
            msg = self._next(deadline, idle, "the start signal")
            if msg.mtype == wire.START:
                return bytes(msg.payload)
            self.drops.drop(f"unexpected {wire.TYPE_NAMES[msg.mtype]} before start", self.where)

    def _next(self, deadline: Optional[float], idle: Callable[[], None], what: str) -> wire.Message:
        while True:
            if self._held:
                return self._held.popleft()
            try:
                msg = self._accept(self.ch.recv(True))
            except IdleTimeout:
                idle()
                now = time.monotonic()
                self.idle_check(now)
                if deadline_passed(deadline, now - HUB_FIRST):
                    raise DistributedError(
                        f"timed out waiting for {what} from rank {self.hub_rank} ({self.role}) "
                        f"at {self.addr}",
                        [self.hub_rank],
                    ) from None
                continue
            if msg is not None:
                return msg

    def wait(
        self,
        op: int,
        want: int,
        deadline: Optional[float],
        idle: Callable[[], None] = lambda: None,
    ) -> memoryview:
        """The hub's reply of type ``want`` to collective ``op``."""
        return self.wait_any(op, (want,), deadline, idle)[1]

    def wait_any(
        self,
        op: int,
        want: tuple[int, ...],
        deadline: Optional[float],
        idle: Callable[[], None] = lambda: None,
    ) -> tuple[int, memoryview]:
        """The hub's reply to collective ``op``, of one of the types ``want``."""
        msg = self._next(deadline, idle, f"the {wire.TYPE_NAMES[want[0]]} result")
        if msg.op == op and msg.mtype in want:
            return msg.mtype, msg.payload
        raise DistributedError(
            mismatch(self.where, op, self.hub_rank, msg.mtype, self.rank, want[0])
        )

    def idle_check(self, now: float) -> None:
        """Read pending frames; raise if the hub aborted the job or has been
        gone for the channel's grace period."""
        while True:
            try:
                msg = self._accept(self.ch.recv(False))
            except IdleTimeout:
                break
            if msg is not None:
                self._held.append(msg)
        down = self.ch.hub_down_since(now)
        # Frames that arrived before the connection closed are answered first.
        if down is not None and now - down >= self.ch.grace and not self._held:
            raise DistributedError(
                f"lost the connection to rank {self.hub_rank} ({self.role}) at {self.addr}: it "
                "died or became unreachable",
                [self.hub_rank],
            )
