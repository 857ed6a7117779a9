"""The link protocol of a ``DistributedContext``: one hub, many members.

A *hub* (the chief, or a node's local chief) listens; each *member*
connects to it. The transport underneath is a channel (``chan``):
stdlib sockets or ZeroMQ. Everything that decides what to trust lives here.

Handshake (per link, at start-up)::

    member -> hub   HELLO  (job key)     rank layout, member nonce, routing id
    hub -> member   WELCOME (job key)    hub nonce + the member's nonce echoed
    member -> hub   READY  (session key) proves the member is live now
    hub -> members  START  (session key) once every expected member is READY

The session key is derived from the hub's fresh nonce, so a HELLO replayed
from an earlier job (same secret) never gets past READY. The routing id is
random per connection and bound into HELLO, so frames replayed from another
connection are not attributed to the rank they name. The hub only sends to
members it has heard from, so no message is lost to a receiver that has
not connected yet (the PUB/SUB "slow joiner" problem).

Failure detection needs no Python thread:

- a member asks its channel whether the hub's connection is gone; gone
  for the channel's ``grace`` (0 for plain sockets, 2 s for ZeroMQ, which
  reconnects) means the hub (the chief or a local chief) is dead;
- a hub waiting for contributions checks the missing ranks every
  ``PROBE_INTERVAL``; unreachable for ``grace`` means dead. The hub then
  sends ABORT, naming the missing ranks, to every member and raises.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import time
from collections import deque
from collections.abc import Iterable
from typing import Callable, Optional, Union

from determined_launch.core.distributed.errors import (
    DistributedConfigError,
    DistributedError,
    format_ranks,
)
from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.transport.chan import HubChannel, IdleTimeout, MemberChannel

#: How often a waiting hub checks the ranks it is missing.
PROBE_INTERVAL = 0.5
#: Mask of the collective counter in an op id (the top bits mark the scope).
OP_MASK = (1 << 62) - 1


@dataclasses.dataclass(frozen=True)
class Peer:
    """What a member says about itself in HELLO."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    #: Mode bits every rank must agree on (hierarchical).
    flags: int = 0
    #: The node-local hub's address when this member is a local chief.
    local_addr: str = ""


_HELLO = struct.Struct("!7I16sH")


def pack_hello(peer: Peer, nonce: bytes, rid: bytes) -> bytes:
    fields = dataclasses.astuple(peer)[:-1]
    return _HELLO.pack(*fields, nonce, len(rid)) + rid + peer.local_addr.encode()


def unpack_hello(payload: Union[bytes, memoryview]) -> tuple[Peer, bytes, bytes]:
    if len(payload) < _HELLO.size:
        raise wire.BadFrame("short hello")
    rank, size, local_rank, local_size, cross_rank, cross_size, flags, nonce, rid_len = (
        _HELLO.unpack_from(payload)
    )
    rest = bytes(payload[_HELLO.size :])
    if rid_len > len(rest):
        raise wire.BadFrame("hello routing id exceeds payload")
    try:
        addr = rest[rid_len:].decode()
    except UnicodeDecodeError:
        raise wire.BadFrame("hello address is not UTF-8") from None
    peer = Peer(rank, size, local_rank, local_size, cross_rank, cross_size, flags, addr)
    return peer, nonce, rest[:rid_len]


def new_rid() -> bytes:
    """A random routing id; a leading zero byte is reserved by libzmq."""
    return b"\x01" + os.urandom(15)


def _error_body(error: DistributedError) -> bytes:
    return json.dumps({"error": str(error), "missing": list(error.missing_ranks)}).encode()


def _error_info(payload: memoryview) -> tuple[str, list[int]]:
    try:
        info = json.loads(bytes(payload))
        return str(info["error"]), [int(r) for r in info["missing"]]
    except (ValueError, KeyError, TypeError):
        return "collectives aborted", []


def _deadline_passed(deadline: Optional[float], now: float) -> bool:
    return deadline is not None and now >= deadline


def _mismatch(where: str, op: int, rank: int, theirs: int, mine_rank: int, mine: int) -> str:
    return (
        f"collective mismatch on {where}: rank {rank} called "
        f"{wire.TYPE_NAMES.get(theirs, f'type {theirs}')} while rank {mine_rank} called "
        f"{wire.TYPE_NAMES[mine]} (collective #{op & OP_MASK}); every rank must call the same "
        "collectives in the same order"
    )


class _Link:
    """What hubs and members share: keys, a send sequence, the drop log."""

    def __init__(self, rank: int, key: wire.MacKey, drops: wire.DropLog, where: str) -> None:
        self.rank = rank
        self.key = key
        self.skey: Optional[wire.MacKey] = None
        self.drops = drops
        self.where = where
        self._seq = 0

    def frame(self, mtype: int, op: int, payload: bytes = b"") -> bytes:
        self._seq += 1
        key = self.key if mtype in (wire.HELLO, wire.WELCOME) else self.skey
        if key is None:  # pragma: no cover - internal ordering error
            raise RuntimeError("session frame before handshake")
        return wire.encode(key, mtype, self.rank, self._seq, op, payload)


# ------------------------------------------------------------------------ hub
class Hub(_Link):
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
                if _deadline_passed(deadline, time.monotonic()):
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
                    DistributedError(_mismatch(self.where, op, rank, msg.mtype, self.rank, want))
                )
        return got

    def _member_failed(self, rank: int, payload: memoryview) -> DistributedError:
        text, missing = _error_info(payload)
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
                DistributedError(_mismatch(self.where, op, rank, mtype, self.rank, want))
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
        if _deadline_passed(deadline, now):
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
        lost = self.ch.send_many([self._rid[r] for r in ranks], frame, deadline)
        if lost and mtype != wire.ABORT:
            ranks_lost = [self._rank_of[rid] for rid in lost]
            how = "timed out taking" if _deadline_passed(deadline, time.monotonic()) else (
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
            self.send_to(list(self._rid), wire.ABORT, 0, _error_body(error), time.monotonic() + 1)
        except Exception:  # pragma: no cover - best effort on a failing link
            pass
        return error


# --------------------------------------------------------------------- member
class Member(_Link):
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
        text, missing = _error_info(payload)
        return DistributedError(f"{text} (reported to rank {self.rank})", missing, relayed=True)

    def report(self, error: DistributedError) -> None:
        """Best effort: tell the hub this member's collective failed, so it
        aborts the others instead of waiting for this member."""
        try:
            self.ch.send(self.frame(wire.FAIL, 0, _error_body(error)), time.monotonic() + 0.5)
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
                if _deadline_passed(deadline, now):
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
            _mismatch(self.where, op, self.hub_rank, msg.mtype, self.rank, want[0])
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
