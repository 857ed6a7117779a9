"""The hub end of a link: the chief's, or a node's local chief's.

It registers members (HELLO, WELCOME, READY, then START once every expected
member is ready), collects their contributions, fans results out, and
probes members it waits for: unreachable for the channel's ``grace`` means
dead, and the hub sends ABORT naming them to everyone. See ``links`` for
the protocol.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Callable, Optional

from determined_launch.core.distributed.errors import (
    DistributedConfigError,
    DistributedError,
    format_ranks,
)
from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import HubChannel, IdleTimeout
from determined_launch.core.distributed.transport.links import (
    Link,
    Peer,
    deadline_passed,
    error_body,
    error_info,
    mismatch,
    unpack_hello,
)

#: How often a waiting hub checks the ranks it is missing.
PROBE_INTERVAL = 0.5


class Hub(Link):
    """Registers members, collects their contributions, fans out, probes."""

    def __init__(
        self,
        channel: HubChannel,
        *,
        rank: int,
        key: wire.MacKey,
        drops: wire.DropLog,
        where: str,
        expected: int,
        check_hello: Callable[[Peer], Optional[str]],
    ) -> None:
        super().__init__(rank, key, drops, where)
        self.ch = channel
        self.nonce = os.urandom(wire.NONCE_SIZE)
        self.skey = wire.session_key(key, self.nonce)
        self.expected = expected
        self._check_hello = check_hello
        #: Registered members (after READY), by global rank.
        self.peers: dict[int, Peer] = {}
        self._rid: dict[int, bytes] = {}
        self._rank_of: dict[bytes, int] = {}
        self._pending: dict[bytes, tuple[Peer, int]] = {}
        self._last: dict[int, int] = {}
        self._inbox: dict[int, dict[int, tuple[int, memoryview]]] = {}
        self._unreachable: dict[int, float] = {}
        self._last_probe = 0.0

    def close(self, linger_ms: int) -> None:
        self.ch.close(linger_ms)

    # --- receiving
    def _recv(self, block: bool) -> Optional[tuple[int, wire.Message]]:
        """A data message from a registered member, or None when the frame
        was dropped or belonged to a handshake. Raises IdleTimeout."""
        item = self.ch.recv(block)
        if item is None:
            return None
        rid, frame = item
        try:
            msg = wire.decode(frame, self.key, self.skey)
        except wire.BadFrame as e:
            self.drops.drop(str(e), self.where)
            return None
        rank = self._rank_of.get(rid)
        if rank is None or rank != msg.sender:
            self._handshake(rid, msg)
            return None
        if msg.seq <= self._last[rank]:
            self.drops.drop(f"replayed or out-of-order frame from rank {rank}", self.where)
            return None
        self._last[rank] = msg.seq
        return rank, msg

    def _handshake(self, rid: bytes, msg: wire.Message) -> None:
        if msg.mtype == wire.HELLO:
            try:
                peer, nonce, claimed = unpack_hello(msg.payload)
            except wire.BadFrame as e:
                self.drops.drop(str(e), self.where)
                return
            if claimed != rid or peer.rank != msg.sender or peer.rank in self._rid:
                self.drops.drop("hello replayed or bound to another connection", self.where)
                return
            problem = self._check_hello(peer)
            if problem is not None:
                raise self.abort(DistributedConfigError(problem))
            self._pending[rid] = (peer, msg.seq)
            self.ch.send(rid, self.frame(wire.WELCOME, 0, self.nonce + nonce))
        elif msg.mtype == wire.READY:
            pending = self._pending.get(rid)
            if pending is None or pending[0].rank != msg.sender or msg.seq <= pending[1]:
                self.drops.drop("ready without a matching hello", self.where)
                return
            peer = pending[0]
            del self._pending[rid]
            if peer.rank in self._rid:
                self.drops.drop(f"second connection for rank {peer.rank}", self.where)
                return
            self._rid[peer.rank] = rid
            self._rank_of[rid] = peer.rank
            self._last[peer.rank] = msg.seq
            self.peers[peer.rank] = peer
            self.ch.trust(rid)
        else:
            self.drops.drop("frame from an unregistered connection", self.where)

    def accept(
        self,
        deadline: Optional[float],
        idle: Callable[[], None],
        start_payload: Callable[[], bytes],
    ) -> None:
        """Wait until ``expected`` members are registered, then START them."""
        while len(self._rid) < self.expected:
            try:
                item = self._recv(True)
            except IdleTimeout:
                idle()
                if deadline_passed(deadline, time.monotonic()):
                    raise self.abort(
                        DistributedError(
                            f"timed out on {self.where}: {len(self._rid)} of {self.expected} "
                            "peers connected"
                        )
                    ) from None
                continue
            if item is not None:
                self._hold(*item)
        self.send_to(list(self._rid), wire.START, 0, start_payload())

    def _hold(self, rank: int, msg: wire.Message) -> None:
        self._inbox.setdefault(msg.op, {})[rank] = (msg.mtype, msg.payload)

    def collect(
        self,
        op: int,
        want: int,
        senders: Iterable[int],
        deadline: Optional[float],
        probe_for: Callable[[set[int]], Iterable[int]],
        idle: Callable[[], None] = lambda: None,
        each: Optional[Callable[[int, memoryview], None]] = None,
    ) -> dict[int, memoryview]:
        """Contributions of type ``want`` to collective ``op`` from ``senders``.

        ``each(rank, payload)`` runs as each one arrives, so work on early
        contributions overlaps the wait for late ones.
        """
        got: dict[int, memoryview] = {}
        missing = set(senders)
        for rank, (mtype, payload) in self._inbox.pop(op, {}).items():
            self._take(op, want, rank, mtype, payload, got, missing, each)
        while missing:
            try:
                item = self._recv(True)
            except IdleTimeout:
                idle()
                self._check(missing, deadline, probe_for)
                continue
            if item is None:
                continue
            rank, msg = item
            if msg.mtype == wire.FAIL:
                raise self.abort(self._member_failed(rank, msg.payload))
            if msg.op == op:
                self._take(op, want, rank, msg.mtype, msg.payload, got, missing, each)
            elif msg.op > op:  # a member's gather does not wait: it can be ahead
                self._hold(rank, msg)
            else:
                raise self.abort(
                    DistributedError(mismatch(self.where, op, rank, msg.mtype, self.rank, want))
                )
        return got

    def _member_failed(self, rank: int, payload: memoryview) -> DistributedError:
        text, missing = error_info(payload)
        return DistributedError(f"{text} (reported by rank {rank})", missing, relayed=True)

    def _take(
        self,
        op: int,
        want: int,
        rank: int,
        mtype: int,
        payload: memoryview,
        got: dict[int, memoryview],
        missing: set[int],
        each: Optional[Callable[[int, memoryview], None]],
    ) -> None:
        if mtype != want:
            raise self.abort(
                DistributedError(mismatch(self.where, op, rank, mtype, self.rank, want))
            )
        got[rank] = payload
        missing.discard(rank)
        if each is not None:
            each(rank, payload)

    def _check(
        self,
        missing: set[int],
        deadline: Optional[float],
        probe_for: Callable[[set[int]], Iterable[int]],
    ) -> None:
        now = time.monotonic()
        dead = self.probe(probe_for(missing), now)
        if dead:
            raise self.abort(
                DistributedError(
                    f"{format_ranks(dead)} died or became unreachable (detected by rank "
                    f"{self.rank} on {self.where})",
                    dead,
                )
            )
        if deadline_passed(deadline, now):
            raise self.abort(
                DistributedError(
                    f"timed out on {self.where}: no contribution from {format_ranks(missing)}",
                    missing,
                )
            )

    # --- sending
    def send_to(
        self,
        ranks: list[int],
        mtype: int,
        op: int,
        payload: bytes = b"",
        deadline: Optional[float] = None,
    ) -> None:
        """Send one frame to ``ranks``; a rank whose connection is gone (or
        that did not take the frame by ``deadline``) has missed a result, so
        the job is aborted naming it."""
        frame = self.frame(mtype, op, payload)
        lost = self.ch.send_many(list(map(self._rid.__getitem__, ranks)), frame, deadline)
        self.check_sent(lost, mtype, deadline)

    def check_sent(self, lost: list[bytes], mtype: int, deadline: Optional[float]) -> None:
        """Abort the job if any peer missed a frame (``send_many``'s answer)."""
        if lost and mtype != wire.ABORT:
            ranks_lost = [self._rank_of[rid] for rid in lost]
            how = "timed out taking" if deadline_passed(deadline, time.monotonic()) else (
                "disconnected before"
            )
            raise self.abort(
                DistributedError(
                    f"{format_ranks(ranks_lost)} {how} a {wire.TYPE_NAMES[mtype]} message from "
                    f"rank {self.rank} on {self.where}",
                    ranks_lost,
                )
            )

    def probe(self, ranks: Iterable[int], now: float) -> list[int]:
        """Ranks unreachable for at least the channel's grace period."""
        ranks = [r for r in ranks if r in self._rid]
        if now - self._last_probe >= PROBE_INTERVAL:
            self._last_probe = now
            ping = self.frame(wire.PING, 0)
            for rank in ranks:
                if self.ch.reachable(self._rid[rank], ping):
                    self._unreachable.pop(rank, None)
                else:
                    self._unreachable.setdefault(rank, now)
        grace = self.ch.grace
        return [r for r in ranks if r in self._unreachable and now - self._unreachable[r] >= grace]

    def abort(self, error: DistributedError) -> DistributedError:
        """Tell every member the collectives failed, and return ``error``."""
        try:
            self.send_to(list(self._rid), wire.ABORT, 0, error_body(error), time.monotonic() + 1)
        except Exception:  # pragma: no cover - best effort on a failing link
            pass
        return error
